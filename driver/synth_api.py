"""``hccc.synthesize``: the program ``hccc synth`` writes, from Python.

    import hccc
    text = hccc.synthesize("cluster.topo", "allgather", time_limit=30)
    texts = hccc.synthesize("cluster.topo", "allreduce", sizes=(64 << 10, 1 << 20))   # {size: text}
    prog = hccc.synthesize_program("cluster.topo", "allgather", time_limit=30)
    ir = hccc.build_program(prog.algorithm)        # the Algorithm prog.text parses to, not parsed

:func:`synthesize_program` gives the whole :class:`~hccc.synth_select.Program` (the text, the
verified Algorithm the compiler takes, the plan and the report), :func:`synthesize` its text.

The options are :class:`~hccc.compiler.synth.plan.SynthOptions`' fields (``hccc synth``'s options
by their Python names: ``root``, ``chunks_per_rank``, ``time_limit``, ``pod_size``, ``smt``,
``variants``, ``select_size``, ``sim_select``, ``method``, ``sizes``, ``band``, ``engine``); the same options
give the same bytes as the command, which runs the same selection (:mod:`hccc.synth_select`).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from hccc.compiler.synth.plan import SynthOptions


def synthesize_program(cluster, collective: str, **options):
    """The :class:`~hccc.synth_select.Program` :func:`synthesize` writes the text of (with several
    ``sizes``, ``{size: Program}``); the same arguments and errors. Its ``algorithm`` is what its
    ``text`` parses to, verified on the cluster: compile that, not the text read back."""
    from hccc.synth_select import synthesize_programs

    programs = synthesize_programs(*_request(cluster, collective, options))
    if len(programs) == 1:
        return programs[0]
    return {p.plan.size: p for p in programs}


def synthesize(cluster, collective: str, **options) -> str | dict[int, str]:
    """The ``.rccl`` text ``hccc synth CLUSTER --collective COLLECTIVE`` writes with ``options``
    (``cluster``: a path to a ``.topo`` or TACCL profile, or a loaded Topology); with several
    ``sizes``, ``{size: text}`` (the files ``ALGO_<size>.rccl``). A :class:`CompileError` for bad
    options (each value checked as the command's parser checks it, the option named as the command
    spells it: :func:`hccc.synth_select.check_options`) or a cluster that cannot be synthesized for,
    as the command reports them; a TypeError for an option it does not know or a cluster that is
    neither a path nor a Topology."""
    got = synthesize_program(cluster, collective, **options)
    return {size: p.text for size, p in got.items()} if isinstance(got, dict) else got.text


def _request(cluster, collective, options: dict):
    """``(topology, SynthOptions)`` for the arguments, each checked as :func:`synthesize` says."""
    from hccc.compiler.pipeline import load_cluster
    known = {f.name for f in fields(SynthOptions)} - {"collective", "cluster_name"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"synthesize() got unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    from hccc.compiler.cluster.topology import Topology

    for key in ("sizes", "band"):
        sizes = options.get(key)
        if sizes is None:
            options.pop(key, None)
        elif isinstance(sizes, Iterable) and not isinstance(sizes, (str, bytes)):
            options[key] = tuple(sizes)    # any iterable of sizes, each checked as given; else refused as is
    if isinstance(options.get("method"), str):
        options["method"] = options["method"].lower()     # as the command takes it
    if isinstance(cluster, (str, Path)):
        name, topo = Path(cluster).name, load_cluster(cluster)
    elif isinstance(cluster, Topology):
        name, topo = None, cluster
    else:
        raise TypeError(f"synthesize(): cluster is a path to a .topo or TACCL profile, or a loaded Topology, "
                        f"not {type(cluster).__name__}")
    opts = SynthOptions(collective=collective.lower() if isinstance(collective, str) else collective,
                        cluster_name=name, **options)
    return topo, opts


__all__ = ["synthesize", "synthesize_program"]
