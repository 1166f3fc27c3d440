"""What a process group is configured with: the backend's :class:`Options` (resolved against the
environment), the topology detected through NVML where none is given, and the catalog and cluster
files they name, each loaded once per process."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hccc.catalog import Catalog, CatalogError


@dataclass
class Options:
    """The backend's options (``init_process_group(..., pg_options=Options(...))``; subgroups
    inherit the default group's). ``catalog``: the algorithm directory (default: the
    ``HCCC_ALGO_DIR`` environment variable; none: the built-in catalog, :mod:`hccc.builtin_catalog`).
    ``cluster``: a cluster description (``.topo`` or TACCL ``.json``; default ``HCCC_CLUSTER``)
    whose simulated times break ties between entries. ``topology``: the machine's ``.topo``
    (default ``HCCC_TOPOLOGY``), the tie-break where no cluster is given. ``kernel_timeout_s``: the
    kernels' spin-wait limit (default: the group's timeout, at most 30 s). ``builtin``: whether the
    built-in catalog serves the calls the catalog directory's entries do not (default True;
    ``HCCC_BUILTIN_CATALOG=0`` turns it off: such calls go to the delegate). Every rank must
    resolve them alike (compared when the group is made)."""

    catalog: str | os.PathLike | None = None
    cluster: str | os.PathLike | None = None
    kernel_timeout_s: float | None = None
    topology: str | os.PathLike | None = None
    builtin: bool | None = None
    _resolved: bool = field(default=False, repr=False)
    _sources: dict = field(default_factory=dict, repr=False)

    def resolved(self) -> "Options":
        """The options with the environment's defaults filled in (and where each came from)."""
        if self._resolved:
            return self
        vals, sources = {}, {}
        for key, env, label in (("catalog", "HCCC_ALGO_DIR", "Options(catalog=)"),
                                ("cluster", "HCCC_CLUSTER", "Options(cluster=)"),
                                ("topology", "HCCC_TOPOLOGY", "Options(topology=)")):
            given = getattr(self, key)
            vals[key] = given if given is not None else (os.environ.get(env) or None)
            sources[key] = label if given is not None else env
        builtin = self.builtin
        sources["builtin"] = "Options(builtin=)" if builtin is not None else BUILTIN_ENV
        if builtin is None:
            env = os.environ.get(BUILTIN_ENV, "1").strip()
            if env not in ("0", "1"):
                raise ValueError(f"hccc: {BUILTIN_ENV} must be 0 or 1; got {env!r}")
            builtin = env == "1"
        return Options(kernel_timeout_s=self.kernel_timeout_s, builtin=bool(builtin), _resolved=True,
                       _sources=sources, **vals)


#: set to 0 to keep the built-in catalog from serving what the catalog directory lacks
BUILTIN_ENV = "HCCC_BUILTIN_CATALOG"


#: set to 0 to keep the backend from describing the machine through NVML when no topology is given
DETECT_ENV = "HCCC_DETECT_TOPOLOGY"


def with_detected_topology(options: Options, device_backends: dict, world: int, detect=None):
    """``options`` with the topology of this machine, detected through NVML, where none was given
    (``HCCC_TOPOLOGY``, ``Options(topology=)``), hccc serves the group's CUDA tensors, CUDA has
    devices, and the machine has as many GPUs as the group has ranks (the group is this machine's
    GPUs: a group spanning hosts falls back anyway). The ``.topo`` is written into hccc's build cache
    (an entry keyed by its contents, the file named by their digest: the cache's trust rule and
    integrity check hold for it), so every rank of the machine names the same file and the group's
    agreement compares its contents like a given topology's. Returns ``(options, note)``: the note
    says why nothing was detected (None when something was, or detection did not apply).
    ``detect``: the detector (default :func:`hccc.compiler.cluster.detect.detect_topology`)."""
    import dataclasses
    import hashlib
    if os.environ.get(DETECT_ENV, "1") == "0" or device_backends.get("cuda", "hccc") != "hccc":
        return options, None
    if detect is None:
        import torch
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return options, None
        from hccc.compiler.cluster.detect import detect_topology as detect
    from hccc.util.diagnostics import CompileError, render_all
    try:
        text, topo = detect()
    except CompileError as exc:
        return options, f"no topology detected: {render_all(exc).strip()}"
    ngpus = topo.nranks
    if ngpus != world:
        return options, (f"no topology detected: this machine has {ngpus} GPUs, the group {world} "
                         "ranks (set HCCC_TOPOLOGY to the cluster's .topo)")
    from hccc.runtime import cache
    name = f"{hashlib.sha256(text.encode()).hexdigest()}.topo"

    def write(tmp: Path) -> None:
        (tmp / name).write_text(text, encoding="utf-8")
    # an entry of the build cache: held to its trust rule, verified against its digest when reused
    path = cache.entry("detected_topology", cache.content_key("detected-topology", text), write) / name
    sources = dict(options._sources, topology="detected through NVML")
    return dataclasses.replace(options, topology=str(path), _sources=sources), None


def file_digest(path) -> str:
    """SHA-256 of a description file's contents, read through the input checks every reader uses
    (a regular file within the input size limit; anything else is an error naming the file)."""
    import hashlib
    from hccc.util.diagnostics import read_input_bytes, render_all
    from hccc.util.diagnostics import CompileError
    try:
        return hashlib.sha256(read_input_bytes(path)).hexdigest()
    except CompileError as exc:
        raise RuntimeError(render_all(exc)) from None


_CATALOGS: dict[str, Catalog] = {}
_CLUSTERS: dict[str, object] = {}


def load_catalog(path) -> Catalog:
    """The catalog in directory ``path`` (None: the empty catalog), loaded once per process; a
    catalog that cannot be used is a RuntimeError with its located errors."""
    if path is None:
        return Catalog.empty()
    key = str(Path(path).resolve())
    if key not in _CATALOGS:
        try:
            _CATALOGS[key] = Catalog.load(path)
        except CatalogError as exc:
            from hccc.util.diagnostics import render_all
            raise RuntimeError(f"hccc: the algorithm catalog cannot be used:\n{render_all(exc)}") from None
    return _CATALOGS[key]


def load_cluster(path):
    """The cluster description at ``path`` (None: none), loaded once per process."""
    if path is None:
        return None
    key = str(Path(path).resolve())
    if key not in _CLUSTERS:
        from hccc.compiler import pipeline
        _CLUSTERS[key] = pipeline.load_cluster(path)
    return _CLUSTERS[key]
