"""``hccc topo T [--json] [--groups] [--plot graph.png]``: summarise a cluster description.

``hccc topo --from-nccl DUMP.xml [DUMP2.xml ...] | --from-smi FILE [FILE ...] | --detect [-o C.topo]``:
make one from what the machine knows (:mod:`hccc.compiler.cluster.import_nccl`,
:mod:`~hccc.compiler.cluster.import_smi`, :mod:`~hccc.compiler.cluster.detect`; one file per node, in
rank order). The ``.topo`` text is parsed back before it is written; with ``-o`` it is written
atomically and summarised as ``hccc topo`` summarises a file, without ``-o`` it is printed.

T is a ``.topo`` file (cluster DSL) or a TACCL topology profile ``.json``; both load through
:func:`hccc.compiler.pipeline.load_cluster`. The text output is a set of plain tables (the same on a
terminal and in a pipe); ``--json`` prints :func:`report` (schema ``hccc.topo/1``, keys below);
``--plot`` draws the cluster (:mod:`hccc.topo_plot`, needs matplotlib).

JSON keys (``hccc.topo/1``; floats are in the units their names say):

* ``schema``, ``name`` (the topology's name), ``file`` (the file name as given)
* ``nranks``, ``nnodes``, ``nlinks``, ``chunk_size`` (S_c, bytes)
* ``tau_ref_us``: the slowest link's one-lane chunk time (null without links); ``bottleneck``: the
  link parameters that attain it (``class``, ``bandwidth_gbps``, ``lanes``, ``alpha_us``) or null
* ``nodes``: one object per node, in rank order: ``name``, ``first_rank``, ``last_rank``, ``ngpus``,
  ``vendor``, ``platform`` (cuda | hip), ``model`` (or null), ``gamma_gbps`` (or null)
* ``vendors``: one object per vendor, sorted: ``vendor``, ``platform``, ``nodes``, ``ranks``,
  ``models`` ({model or "unknown": ranks})
* ``link_classes``: one object per distinct link parameter set, by class (direct, switch, internode,
  nic) then falling bandwidth: ``class``, ``links``, ``bandwidth_gbps`` (per lane), ``lanes``,
  ``total_gbps``, ``alpha_us``, ``tau_us`` (alpha + S_c / bandwidth), ``tau_ref_over_tau``,
  ``capacity`` (C(u,v) = ceil(tau_ref / tau) * lanes)
* ``shared_groups``: one object per group, by id: ``id``, ``kind``, ``direction``, ``label``,
  ``links`` (member count), ``bandwidth_gbps``, ``lanes``, ``capacity_gbps``, ``capacity`` (C_g)
* ``topo``: the ``.topo`` text, for an import without ``-o`` (``file`` is null then)
* ``hierarchy``: the HetCCL view (:func:`hccc.compiler.cluster.hierarchy.hierarchy`): homogeneous clusters
  (same vendor, model and interconnect) with their border ranks (behind a NIC) and internal ranks
"""
from __future__ import annotations

import json
import sys

from hccc.args import add_cluster_argument

from hccc.util.plural import plural
from hccc.table import table_lines
from hccc.compiler.cluster.topology import LINK_CLASSES, Topology, chunk_time, logical_capacity
from hccc.util.limits import printable

SCHEMA = "hccc.topo/1"
PLATFORM = {"nvidia": "cuda", "amd": "hip"}


EPILOG = """\
--json keys (schema hccc.topo/1):
  schema, name, file, nranks, nnodes, nlinks, chunk_size (bytes), tau_ref_us, bottleneck
  nodes[]:         name, first_rank, last_rank, ngpus, vendor, platform, model, gamma_gbps
  vendors[]:       vendor, platform, nodes, ranks, models {model: ranks}
  link_classes[]:  class, links, bandwidth_gbps, lanes, total_gbps, alpha_us, tau_us,
                   tau_ref_over_tau, capacity (C(u,v) = ceil(tau_ref / tau) * lanes)
  shared_groups[]: id, kind, direction, label, links, bandwidth_gbps, lanes, capacity_gbps,
                   capacity (C_g)
  hierarchy:       homogeneous clusters with border and internal ranks (HetCCL)
  topo:            the .topo text (an import without -o)

from the machine (one file per node, in rank order; -o writes the .topo, else it is printed):
  hccc topo --from-nccl node0.xml node1.xml -o cluster.topo   NCCL_TOPO_DUMP_FILE's XML
  hccc topo --from-smi node0.txt -o cluster.topo             saved `nvidia-smi topo -m` (and -L)
  hccc topo --detect -o cluster.topo                         this machine through NVML (hccc[detect])
"""


SUMMARY = "summarise a cluster description, or make one from the machine"
INPUTS = {"cluster": "cluster"}


def configure(parser) -> None:
    parser.epilog = EPILOG
    add_cluster_argument(parser, "cluster", "cluster description (.topo, or a TACCL profile .json)")
    parser.add_argument("--json", action="store_true",
                        help=f"print one JSON object (schema {SCHEMA}; keys below)")
    parser.add_argument("--groups", action="store_true", help="list every shared group in the text output")
    parser.add_argument("--plot", metavar="PNG", help="also draw the cluster into this PNG file (needs matplotlib)")
    parser.set_defaults(cluster_dest=None, topo_parser=parser)   # T is not needed when importing (run() checks)
    src = parser.add_argument_group("make a cluster description from the machine").add_mutually_exclusive_group()
    src.add_argument("--from-nccl", nargs="+", metavar="DUMP.xml",
                     help="NCCL's topology dumps (the XML NCCL_TOPO_DUMP_FILE writes), one per node")
    src.add_argument("--from-smi", nargs="+", metavar="FILE",
                     help="saved output of `nvidia-smi topo -m` (with `nvidia-smi -L` lines for the GPU names), "
                          "one per node")
    src.add_argument("--detect", action="store_true",
                     help="this machine's GPUs through NVML (pip install 'hccc[detect]')")
    parser.add_argument("-o", "--output", metavar="C.topo",
                        help="write the imported cluster here (default: print it)")
    parser.add_argument("--gpu", metavar="MODEL",
                        help="--from-smi: the GPU model (A100, H100, ...; else the file's `nvidia-smi -L` "
                             "lines name it)")
    parser.add_argument("--nic-gbit", metavar="GBIT", type=_gbit,
                        help="--from-smi: NIC port speed in Gbit/s (the matrix does not say; default 200)")


def _gbit(text: str):
    import argparse
    from fractions import Fraction
    if not text or len(text) > 12 or not all(c.isdigit() or c == "." for c in text) or text.count(".") > 1 \
            or text.startswith(".") or text.endswith("."):
        raise argparse.ArgumentTypeError(f"not a speed in Gbit/s: {printable(text, limit=20)!r}")
    value = Fraction(text)
    if not 0 < value <= 100_000:
        raise argparse.ArgumentTypeError("must be above 0 and at most 100000 Gbit/s")
    return value


def _f(x) -> float:
    return float(x)


def report(topo: Topology, file: str | None = None) -> dict:
    """The ``--json`` object (see the module docstring for its keys)."""
    us = 10 ** 6
    tau_ref = topo.tau_ref_exact
    nodes = [{"name": nd.name, "first_rank": nd.offset, "last_rank": nd.offset + nd.ngpus - 1, "ngpus": nd.ngpus,
              "vendor": nd.vendor, "platform": PLATFORM[nd.vendor], "model": nd.model,
              "gamma_gbps": None if nd.gamma_gbps is None else _f(nd.gamma_gbps)} for nd in topo.nodes]
    vendors: dict[str, dict] = {}
    for nd in topo.nodes:
        v = vendors.setdefault(nd.vendor, {"vendor": nd.vendor, "platform": PLATFORM[nd.vendor], "nodes": 0,
                                           "ranks": 0, "models": {}})
        v["nodes"] += 1
        v["ranks"] += nd.ngpus
        m = nd.model or "unknown"
        v["models"][m] = v["models"].get(m, 0) + nd.ngpus
    for v in vendors.values():
        v["models"] = dict(sorted(v["models"].items()))
    counts: dict[int, int] = {}
    for pid in topo.link_param.tolist():
        counts[pid] = counts.get(pid, 0) + 1
    classes = []
    bottleneck = None
    for pid, k in counts.items():
        p = topo.params[pid]
        tau = chunk_time(p.alpha_us, p.bandwidth_gbps, topo.chunk_size)
        classes.append({"class": p.cls, "links": k, "bandwidth_gbps": _f(p.bandwidth_gbps), "lanes": p.lanes,
                        "total_gbps": _f(p.bandwidth_gbps * p.lanes), "alpha_us": _f(p.alpha_us),
                        "tau_us": _f(tau * us), "tau_ref_over_tau": _f(tau_ref / tau),
                        "capacity": logical_capacity(tau_ref, tau, p.lanes)})
        if tau == tau_ref:
            cand = {"class": p.cls, "bandwidth_gbps": _f(p.bandwidth_gbps), "lanes": p.lanes,
                    "alpha_us": _f(p.alpha_us)}
            key = (LINK_CLASSES.index(p.cls), cand["bandwidth_gbps"], p.lanes, cand["alpha_us"])
            if bottleneck is None or key < bottleneck[0]:
                bottleneck = (key, cand)
    classes.sort(key=lambda c: (LINK_CLASSES.index(c["class"]), -c["bandwidth_gbps"], -c["lanes"], c["alpha_us"]))
    groups = [{"id": g.id, "kind": g.kind, "direction": g.direction, "label": g.label, "links": int(g.members.size),
               "bandwidth_gbps": _f(g.bandwidth_gbps), "lanes": g.lanes,
               "capacity_gbps": _f(g.bandwidth_gbps * g.lanes), "capacity": int(g.capacity)} for g in topo.groups]
    return {
        "schema": SCHEMA,
        "name": topo.name,
        "file": file,
        "nranks": int(topo.nranks),
        "nnodes": len(topo.nodes),
        "nlinks": int(topo.nlinks),
        "chunk_size": int(topo.chunk_size),
        "tau_ref_us": None if tau_ref is None else _f(tau_ref * us),
        "bottleneck": None if bottleneck is None else bottleneck[1],
        "nodes": nodes,
        "vendors": [vendors[k] for k in sorted(vendors)],
        "link_classes": classes,
        "shared_groups": groups,
    }


def _num(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    s = f"{x:.{digits}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def _size(b: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def _ranks(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}-{b}"


def format_text(rep: dict, all_groups: bool = False) -> str:
    """The human-readable summary of a :func:`report`."""
    out = []
    src = f" ({printable(str(rep['file']))})" if rep["file"] else ""
    out.append(f"cluster {rep['name']}{src}: {plural(rep['nnodes'], 'node')}, {plural(rep['nranks'], 'GPU')}, "
               f"{plural(rep['nlinks'], 'link')}, {plural(len(rep['shared_groups']), 'shared group')}")
    line = f"chunk size S_c = {_size(rep['chunk_size'])}"
    if rep["tau_ref_us"] is not None:
        bn = rep["bottleneck"]
        line += (f"; tau_ref = {_num(rep['tau_ref_us'])} us (slowest link: {bn['class']}, "
                 f"{_num(bn['bandwidth_gbps'])} GB/s per lane, alpha {_num(bn['alpha_us'])} us)")
    out.append(line)
    out.append("")
    out.append("nodes")
    rows = [[nd["name"], _ranks(nd["first_rank"], nd["last_rank"]), str(nd["ngpus"]), nd["vendor"], nd["platform"],
             nd["model"] or "-", "-" if nd["gamma_gbps"] is None else f"{_num(nd['gamma_gbps'])} GB/s"]
            for nd in rep["nodes"]]
    out += table_lines(["node", "ranks", "GPUs", "vendor", "platform", "model", "gamma"], rows, {2})
    out.append("")
    out.append("vendors")
    rows = [[v["vendor"], v["platform"], str(v["nodes"]), str(v["ranks"]),
             ", ".join(f"{m} x{k}" for m, k in v["models"].items())] for v in rep["vendors"]]
    out += table_lines(["vendor", "platform", "nodes", "ranks", "models"], rows, {2, 3})
    out.append("")
    out.append("link classes   tau = alpha + S_c / bandwidth (one lane);  C(u,v) = ceil(tau_ref / tau) * lanes")
    if rep["link_classes"]:
        rows = [[c["class"], str(c["links"]), _num(c["bandwidth_gbps"]), str(c["lanes"]), _num(c["total_gbps"]),
                 _num(c["alpha_us"]), _num(c["tau_us"]), _num(c["tau_ref_over_tau"]), str(c["capacity"])]
                for c in rep["link_classes"]]
        out += table_lines(["class", "links", "GB/s/lane", "lanes", "total GB/s", "alpha us", "tau us", "tau_ref/tau",
                       "C(u,v)"], rows, {1, 2, 3, 4, 5, 6, 7, 8})
    else:
        out.append("  (no links)")
    out.append("")
    groups = rep["shared_groups"]
    if all_groups:
        out.append("shared groups   C_g = ceil(tau_ref / tau_g) * lanes")
        rows = [[str(g["id"]), g["kind"], g["direction"], str(g["links"]), _num(g["bandwidth_gbps"]), str(g["lanes"]),
                 _num(g["capacity_gbps"]), str(g["capacity"]), g["label"]] for g in groups]
        out += table_lines(["id", "kind", "direction", "links", "GB/s/lane", "lanes", "capacity GB/s", "C_g", "label"],
                      rows, {0, 3, 4, 5, 6, 7})
    else:
        out.append("shared groups (alike groups together; --groups lists each)   C_g = ceil(tau_ref / tau_g) * lanes")
        agg: dict[tuple, list] = {}
        for g in groups:
            key = (g["kind"], g["bandwidth_gbps"], g["lanes"], g["capacity"], g["links"])
            e = agg.setdefault(key, [0, []])
            e[0] += 1
            if g["direction"] not in e[1]:
                e[1].append(g["direction"])
        kind_order = {c: i for i, c in enumerate(LINK_CLASSES)}
        keys = sorted(agg, key=lambda k: (kind_order.get(k[0], len(kind_order)), k[0], -k[1] * k[2], k[4]))
        rows = [[k[0], str(agg[k][0]), ", ".join(agg[k][1]), str(k[4]), _num(k[1]), str(k[2]), _num(k[1] * k[2]),
                 str(k[3])] for k in keys]
        if rows:
            out += table_lines(["kind", "groups", "directions", "links each", "GB/s/lane", "lanes", "capacity GB/s", "C_g"],
                          rows, {1, 3, 4, 5, 6, 7})
    if not groups:
        out.append("  (none)")
    return "\n".join(out)


def _import(args):
    """(nodes, title, input paths) of an import option; CompileErrors for bad inputs."""
    if args.from_nccl:
        from hccc.compiler.cluster.import_nccl import load_nccl_dump
        return [load_nccl_dump(p) for p in args.from_nccl], "NCCL topology dump", list(args.from_nccl)
    if args.from_smi:
        from hccc.compiler.cluster.import_smi import load_smi_topo
        return ([load_smi_topo(p, args.gpu, args.nic_gbit) for p in args.from_smi], "nvidia-smi topo -m",
                list(args.from_smi))
    from hccc.compiler.cluster.detect import detect_machine
    return [detect_machine()], "NVML on this machine", []


def run_import(args) -> int:
    from pathlib import Path

    from hccc.compiler.backend.output_dir import check_output_file, write_text_atomically
    from hccc.compiler.cluster.hierarchy import hierarchy
    from hccc.compiler.cluster.machine import write_topology
    from hccc.compiler.cluster.topo_limits import MAX_NODES

    inputs = list(args.from_nccl or args.from_smi or [])
    if len(inputs) > MAX_NODES:     # one file per node: refused before any is read
        sys.stderr.write(f"hccc topo: error: {len(inputs)} files, one per node: a cluster has at most "
                         f"{MAX_NODES} nodes\n")
        return 2
    if args.output:
        check_output_file(args.output, inputs)     # before the work: never over an input, a device, a link
    nodes, what, paths = _import(args)
    name = Path(args.output).name if args.output else "imported.topo"
    names = ", ".join(Path(p).name for p in paths)
    title = f"imported by hccc topo from {what}{': ' + names if names else ''}"
    text, topo = write_topology(nodes, title, name)
    if not args.output:
        if args.json:
            rep = report(topo, None)
            rep["hierarchy"] = hierarchy(topo).summary()
            rep["topo"] = text
            print(json.dumps(rep, indent=1))
        else:
            sys.stdout.write(text)
        return 0
    write_text_atomically(args.output, text, inputs)
    rep = report(topo, Path(args.output).name)
    hier = hierarchy(topo)
    rep["hierarchy"] = hier.summary()
    _print_report(rep, hier, args, wrote=args.output)
    return 0


def run(args) -> int:
    from pathlib import Path

    from hccc.compiler.pipeline import load_cluster

    importing = bool(args.from_nccl or args.from_smi or args.detect)
    if importing and args.cluster is not None:
        args.topo_parser.error("give a cluster description T or an import option (--from-nccl, --from-smi, "
                               "--detect), not both")
    if not importing:
        for opt, val in (("-o", args.output), ("--gpu", args.gpu), ("--nic-gbit", args.nic_gbit)):
            if val is not None:
                args.topo_parser.error(f"{opt} goes with --from-nccl, --from-smi or --detect")
        if args.cluster is None:
            args.topo_parser.error("the following arguments are required: T (a cluster description, .topo or "
                                   "TACCL .json; or --topology T), or one of --from-nccl, --from-smi, --detect")
    if importing:
        if args.plot:
            args.topo_parser.error("--plot draws a cluster file: import with -o, then hccc topo FILE --plot")
        if (args.gpu or args.nic_gbit is not None) and not args.from_smi:
            args.topo_parser.error("--gpu and --nic-gbit go with --from-smi")
        return run_import(args)

    if args.plot:
        from hccc.compiler.backend.output_dir import check_output_file
        check_output_file(args.plot, [args.cluster])    # before the work: a new or regular file, not the cluster
    topo = load_cluster(args.cluster)
    from hccc.compiler.cluster.hierarchy import hierarchy

    rep = report(topo, Path(args.cluster).name)
    hier = hierarchy(topo)
    rep["hierarchy"] = hier.summary()
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            sys.stderr.write("hccc topo: error: --plot needs matplotlib (pip install 'hccc[plot]')\n")
            return 1
        from hccc.progress import Progress
        from hccc.topo_plot import draw
        try:
            with Progress("hccc topo", enabled=not args.json) as prog, prog.phase(f"drawing {args.plot}"):
                draw(topo, args.plot)
        except OSError as exc:
            sys.stderr.write(f"hccc topo: error: cannot write '{args.plot}': {exc.strerror or exc}\n")
            return 1
    _print_report(rep, hier, args, wrote=args.plot)
    return 0


def _print_report(rep: dict, hier, args, wrote) -> None:
    """A cluster's report: JSON, or its table, its hierarchy and the file written (if any)."""
    if args.json:
        print(json.dumps(rep, indent=1))
        return
    print(format_text(rep, args.groups))
    print()
    print(hier.describe())
    if wrote:
        print(f"\nwrote {printable(str(wrote))}")
