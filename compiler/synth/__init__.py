"""Schedule synthesis for heterogeneous clusters (HeteCCL section 5, Appendix H-I).

    from hccc.compiler.synth import synthesize, to_rccl
    result = synthesize(topology, "allgather", time_limit=10)
    text = to_rccl(result, topology)

Modules: :mod:`.problem` (the chunked network model, tasks, schedules), :mod:`.greedy` (the
hierarchy-aware greedy heuristic), :mod:`.check` (verification with counterexamples), :mod:`.smt`
(z3 encodings, incremental), :mod:`.cegis` (the CEGIS loop and step minimisation), :mod:`.bounds`
(step and bandwidth lower bounds), :mod:`.collectives` (AllGather, Broadcast, ReduceScatter,
AllReduce), :mod:`.compose` (hierarchical composition over isomorphic pods), :mod:`.emit`
(Algorithm and ResCCLang text); :mod:`.trees` (bandwidth-optimal spanning-tree packing: its parts
:mod:`.packing`, :mod:`.arborescence`, :mod:`.packing_lp`, :mod:`.rounding`, :mod:`.balancing`,
:mod:`.tree_shapes`, :mod:`.tree_rows`) and :mod:`.forest` (its AllGather / ReduceScatter / AllReduce programs: ``method="trees"``), with
:mod:`.master_lp` (the packing LP in one HiGHS model), :mod:`.branchings` (integral packings at a
chunk count), :mod:`.symmetry` (the cluster's automorphisms), :mod:`.exchanges` (shallower trees)
and :mod:`.edmonds_kernel` (arborescences, compiled); :mod:`.broadcast_trees` (Broadcast by trees
of its root), :mod:`.alltoall` (AllToAll: routing, then list scheduling), :mod:`.maxflow` (the
cut bounds' exact max-flow) and :mod:`.budget` (the time the closing phases need, kept back).

Choosing among programs: :mod:`hccc.synth_select` (the selection loop behind an ``Evaluator``, the simulator
wired in by ``hccc synth`` and :func:`hccc.synthesize`), :mod:`.plan` (``SynthOptions``, and the
``SynthPlan`` every choice reaches the emitter in), :mod:`hccc.synth_engines` (``--for hccc|msccl|mscclpp``),
:mod:`hccc.synth_api` (``hccc.synthesize``: the bytes ``hccc synth`` writes); those three live in the
driver layer (``driver/``), which may import the runtime's simulator and the exporters.
"""
from hccc.compiler.synth.collectives import COLLECTIVES, SynthResult, bandwidth_cut_bound, synthesize
from hccc.compiler.synth.emit import to_algorithm, to_rccl
from hccc.compiler.synth.problem import Network, Schedule, Task, allgather_task, broadcast_task, network_from_topology

__all__ = ["COLLECTIVES", "SynthResult", "synthesize", "bandwidth_cut_bound", "to_algorithm", "to_rccl",
           "Network", "Schedule", "Task", "allgather_task", "broadcast_task", "network_from_topology"]
