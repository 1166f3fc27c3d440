"""What every rank of a new process group must agree on before its first call: every rank's
set-up outcome and every input to the choice of algorithm (the catalog, the cluster and topology
descriptions, the device map, hccc's version), gathered through the store and compared, so that a
failure or a difference is an error on every rank at once, naming the ranks. The gathering also
tells each rank its peers' hosts and nodes, and maps the peers' call records (the ledger)."""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass

import torch.distributed as dist

from hccc.torch.ledger import StoreLedger
from hccc.torch.options import file_digest


def choice_inputs(options, catalog, device_backends: dict[str, str]) -> dict[str, list]:
    """Every input to the choice of algorithm, as ``name -> [what is compared, what is shown]``:
    the catalog (its files' fingerprint), the cluster and topology descriptions (their contents),
    the device map and hccc's version. Paths are shown, contents compared (two ranks may read the
    same files from different places). ``options``: the group's resolved
    :class:`~hccc.torch.options.Options`."""
    src = options._sources

    def given(key: str) -> str:
        label = src.get(key, "")
        return f" (given as {label})" if label.startswith("Options(") else ""
    out = {}
    out["the algorithm catalog (HCCC_ALGO_DIR)"] = [
        catalog.fingerprint, (f"{len(catalog.entries)} entries from {catalog.directory} "
                              f"[{catalog.fingerprint[:12]}]{given('catalog')}")
        if catalog.directory is not None else "(not set: the built-in catalog)"]
    for key, env, value in (("cluster", "HCCC_CLUSTER", options.cluster),
                            ("topology", "HCCC_TOPOLOGY", options.topology)):
        if value is None:
            out[env] = ["", "(not set)"]
        else:
            d = file_digest(value)
            out[env] = [d, f"{value} [{d[:12]}]{given(key)}"]
    fills = "1" if options.builtin else "0"
    out["whether the built-in catalog fills the catalog's gaps (HCCC_BUILTIN_CATALOG)"] = [
        fills, f"{fills}{given('builtin')}"]
    dmap = ",".join(f"{d}:{b}" for d, b in sorted(device_backends.items()))
    out["the device map"] = [dmap, dmap]
    from hccc import __version__
    out["the hccc version"] = [__version__, __version__]
    return out


@dataclass
class Agreed:
    """What the agreement gives a rank: every rank's node (:func:`hccc.runtime.net.node_name`), the
    ledger the group compares its calls through, and why every call runs on the delegate (a group
    across hosts), or None."""
    nodes: list
    ledger: object
    disabled: str | None


def agree(store, rank: int, size: int, timeout_s: float, *, problem: str | None, inputs: dict,
          node: str | None, ledger, catalog_used: bool) -> Agreed:
    """Gather every rank's set-up outcome (``problem``: why this rank's set-up failed, or None) and
    choice ``inputs`` through ``store``, and compare them: a rank whose set-up failed or an input on
    which ranks differ is a RuntimeError on every rank, naming the ranks. Ranks on one host map
    each other's ``ledger`` (a :class:`~hccc.torch.ledger.ShmLedger`); ranks on several hosts
    compare their calls through the store instead and, where ``catalog_used`` (the group has a
    catalog to run), run everything on the delegate (a Communicator maps its peers' memory)."""
    from hccc.runtime.bootstrap import BootstrapError, StoreBootstrap
    me = {"problem": problem, "inputs": inputs, "host": socket.gethostname(), "node": node,
          "ledger": ledger.handle.hex() if ledger is not None else ""}
    try:
        boot = StoreBootstrap(store, rank, size, name="agree", timeout_s=timeout_s)
        peers = [json.loads(b) for b in boot.all_gather(json.dumps(me).encode(), "catalog")]
    except BootstrapError as exc:
        raise RuntimeError(f"hccc: rank {rank}: {exc}") from None
    failed = [(r, p["problem"]) for r, p in enumerate(peers) if p["problem"]]
    if failed:
        raise RuntimeError("hccc: the process group's set-up failed on " + "; ".join(
            f"rank {r}: {why}" for r, why in failed))
    _compare_inputs(peers)
    hosts = sorted({p["host"] for p in peers})
    nodes = [p["node"] for p in peers]
    if len(hosts) > 1:
        # a group across hosts compares its calls through the store
        ledger.close()
        disabled = (f"the group spans {len(hosts)} hosts; hccc's communicators map their peers' "
                    "memory, so every call runs on the delegate") if catalog_used else None
        return Agreed(nodes, StoreLedger(dist.PrefixStore("ledger/", store), rank, size), disabled)
    try:
        ledger.attach([bytes.fromhex(p["ledger"]) for p in peers])
        boot.barrier("ledger")
    except Exception as exc:
        raise RuntimeError(f"hccc: rank {rank}: cannot map the peers' call records: {exc}") from None
    ledger.mapped()
    return Agreed(nodes, ledger, None)


def _compare_inputs(peers: list[dict]) -> None:
    """A RuntimeError naming every input on which the ranks differ, and which ranks see what."""
    lines = []
    for name in peers[0]["inputs"]:
        seen: dict[str, list[int]] = {}
        shown: dict[str, str] = {}
        for r, p in enumerate(peers):
            key, text = p["inputs"].get(name, ["", "(not set)"])
            seen.setdefault(key, []).append(r)
            shown[key] = text
        if len(seen) > 1:
            groups = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: "
                               f"{shown[k]}" for k, rs in seen.items())
            lines.append(f"{name} ({groups})")
    if lines:
        raise RuntimeError(
            "hccc: the ranks disagree on " + "; and on ".join(lines) + ": every rank must load "
            "the same algorithm catalog and set every input to the choice of algorithm alike, "
            "or ranks pick different algorithms")
