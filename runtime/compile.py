"""The compile as ``hccc ALGO -o OUTDIR`` and the Python API run it (``hccc.compile``): the
compiler's passes (:mod:`hccc.compiler.pipeline.compile`) with the alpha-beta simulator as the
cost model whenever a cluster is given (:class:`~hccc.runtime.simulator.SimulatedCost`: state-based
thread blocks only where sharing them costs no time there, fusion where it is never slower), so
both compile the same program, byte for byte."""
from __future__ import annotations

from pathlib import Path

from hccc.compiler.pipeline import ClusterSource, CompileContext, CompileOptions, StageTimes, read_cluster
from hccc.compiler.pipeline import compile as passes


def cluster_of(topology) -> ClusterSource | None:
    """``topology`` (a path, a :class:`ClusterSource` or None) as a ClusterSource."""
    if topology is None or isinstance(topology, ClusterSource):
        return topology
    return read_cluster(topology)


def cost_model_for(cluster: ClusterSource | None):
    """The cost model of a compile on ``cluster``: the simulator there (None without a cluster)."""
    if cluster is None:
        return None
    from hccc.runtime.simulator import SimulatedCost
    return SimulatedCost(cluster.topology)


def context(algo, options: CompileOptions | None = None, *, topology=None, xml_limits=None,
            times: StageTimes | None = None) -> CompileContext:
    """The context of compiling ``algo`` (a path, an Algorithm or a ProgramIR) with ``options`` on
    ``topology`` (a path or a ClusterSource; read here, its time counted under ``topology``)."""
    times = times or StageTimes()
    cluster = times.run("topology", cluster_of, topology) if topology is not None else None
    return passes.context_for(algo, options, cluster=cluster, cost_model=cost_model_for(cluster),
                              xml_limits=xml_limits, times=times)


def compile(algo, outdir: str | Path, options: CompileOptions | None = None, *, topology=None,   # noqa: A001
            xml_limits=None, times: StageTimes | None = None) -> CompileContext:
    """Compile ``algo`` into ``outdir`` (replaced atomically) as ``hccc ALGO -o OUTDIR`` does.
    Returns the finished context: ``.ir``, ``.files``, ``.notes`` (warnings), ``.times``."""
    return passes.compile(context(algo, options, topology=topology, xml_limits=xml_limits, times=times), outdir)


def build(algo, options: CompileOptions | None = None, *, topology=None):
    """The ProgramIR ``compile`` would emit (before the channel count is chosen); nothing written."""
    return passes.build(context(algo, options, topology=topology))


__all__ = ["compile", "build", "context", "cost_model_for", "cluster_of"]
