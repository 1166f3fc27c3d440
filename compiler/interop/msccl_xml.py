"""MSCCL XML interop: export a ProgramIR for the MSCCL executor / RCCL, import their algorithms.

The dialect (what msccl-executor-nccl and RCCL's MSCCL path load, and what msccl-tools writes)::

    <algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>
      <gpu id i_chunks o_chunks s_chunks>
        <tb id send recv chan>
          <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>

``coll`` is ``allgather`` / ``allreduce`` / ``reducescatter``; ``proto`` ``Simple`` / ``LL`` / ``LL128``;
buffers ``i`` (input), ``o`` (output), ``s`` (scratch); step types ``s`` send, ``r`` recv, ``rcs``
recv-copy-send, ``rrs`` recv-reduce-send, ``rrc`` recv-reduce-copy, ``rrcs`` recv-reduce-copy-send,
``cpy`` local copy, ``re`` local reduce, ``nop``. A step waits for step ``deps`` of thread block
``depid`` of its GPU (``-1``: no wait); ``hasdep="1"`` makes a step signal its completion (only
signalling steps end a wait). Only the operands a step type uses locally matter to the runtimes
(``s``: src; ``r``/``rcs``: dst; ``rrs``: src; the others both).

Chunk model. ``nchunksperloop`` = ProgramIR ``nchunks``: the collective's full buffer is that many
chunks (AllGather's output, ReduceScatter's and AllReduce's input). ProgramIR's buffers are the
collective's: AllGather input = the rank's ``k = nchunks / ngpus`` own chunks (input slot ``j`` is
chunk ``rank*k + j``), ReduceScatter output likewise, everything else ``nchunks`` slots; scratch has
the largest ``s_chunks``. This is the same indexing as the runtimes', so offsets carry over.

Export (:func:`export_xml`). An MSCCL thread block (TB) has one send peer, one receive peer and one
channel for its whole life; an hccc TB (state-based allocation) serves several connections one
after another. The exporter therefore

* splits every hccc TB into MSCCL TBs, one per group of connection ends that its forwarding
  primitives (``rcs``/``rrcs``/``rrs``) tie together; a group needing two send or two receive peers
  has its forwarding primitives un-fused (``rcs`` -> ``r`` + ``s`` of the stored chunk, ``rrcs`` ->
  ``rrc`` + ``s``); local copies/reductions stay with their neighbour in the hccc TB;
* turns the original order of each hccc TB into dependencies wherever consecutive primitives land
  in different MSCCL TBs (so every wait the hccc TB got from program order is kept), drops
  dependencies implied by program order and by other dependencies (vector clocks over the rank's
  TBs), and writes the rest as one ``depid``/``deps`` per step with extra ones as preceding ``nop``
  steps (the runtimes accept one dependency per step); targets get ``hasdep="1"``;
* (AllGather) makes sends of the rank's own chunk read the output copy of it, after the local copy,
  so a chunk keeps one buffer position along its path as in msccl-tools' programs;
* writes, for ops without a local source or destination, the remote end's buffer/offset there (a
  send names where its receiver stores the chunk, a receive where its sender read it), as
  msccl-tools does and XML checkers expect; one element per line, no XML declaration (the runtimes'
  hand-written XML readers do not accept one), attributes in the order above;
* merges the MSCCL TBs cut from one hccc TB back together while they need at most one send and
  one receive peer on one channel (they ran one after another anyway; fewer TBs), unless that
  makes a TB longer than the step limit;
* moves whole connections (with the TBs they tie together) to further channels when a rank has
  more send-peer or receive-peer TBs on a channel than the runtime allows;
* checks the target runtime's limits (:class:`XmlLimits`: steps per TB, ``cnt``, TBs per channel,
  dependency TB ids, offsets, channels, XML elements) and fails with a message naming the TB and
  the option that relaxes it (the older msccl executor: :data:`LEGACY_LIMITS`).

Algorithms (:func:`export_algorithm`) are exported from the program the runtimes' execution runs
best: the algorithm's steps in order on one thread block per connection end
(``passes.build.build_algorithm_level``), after a check of the runtime limits on the transfer table
alone (:mod:`hccc.compiler.interop.msccl_limits`: lower bounds, so it refuses only what the
export would refuse). Options of both entry points: ``fuse`` pairs a thread block that receives
from ``p`` with one that sends to ``q`` where sends forward what receives stored, orders their
steps by the program's order (sends of a step first) and makes each such pair one
``rcs``/``rrcs``/``rrs`` step (``rrs`` when the stored result is overwritten before anything
reads it); ``instances=K`` writes K copies of every thread block (ids ``id*K+i``, channels
``i*nchannels+ch``), instance ``i`` moving chunks ``[off*K + i*cnt, off*K + (i+1)*cnt)`` of K times
finer buffers. Fused or instanced text is re-imported (proof and deadlock check) before it is
returned; a fused export that fails is written unfused.

Execution models. hccc's kernels run each primitive for every micro-batch before the next one
(task-level); the MSCCL runtimes run a TB's whole step list once per slice, with connection FIFOs
that hold two Simple (eight LL/LL128) messages. Every hccc program is deadlock-free under both; an
MSCCL program usually only under the second (a TB that sends and then receives on a ring), so the
importer checks deadlock freedom the runtimes' way and marks programs that need it with
``origin.execution = "algorithm"`` (``"task"`` when hccc's own, stricter check passes too).

Import (:func:`import_xml`). Both msccl-tools output (no ``outofplace``/``minBytes``/``maxBytes``;
``outofplace`` is then ``not inplace``) and the runtime dialect are read; unknown attributes are
ignored as the runtimes do, unknown elements and values are errors with ``FILE:LINE:COL``. The
program is checked the way the runtimes would run it (steps numbered in order, peers, channels,
each connection end in one TB, k-th send = k-th receive with equal ``cnt``, dependencies resolved
to the first signalling step, deadlock freedom with one FIFO slot per connection) and then *proven*
to implement its collective by :mod:`hccc.compiler.ir.symbolic` (no data races; symbolic chunk
contents). An algorithm that is in-place only (``inplace=1 outofplace=0``) is normalised so the
ProgramIR also runs out of place: its references to the aliased buffer are redirected (AllReduce
input -> output, AllGather input ``j`` -> output ``rank*k + j``, ReduceScatter output ``j`` -> input
``rank*k + j``) and a copy moves the data in first (AllReduce/AllGather) or out last
(ReduceScatter); in-place runs skip that copy, since its source and destination coincide.
"""
from __future__ import annotations

from hccc.compiler.interop.msccl_export import export_algorithm, export_xml
from hccc.compiler.interop.msccl_format import LEGACY_LIMITS, XmlLimits
from hccc.compiler.interop.msccl_import import import_xml, import_xml_text

__all__ = ["export_xml", "export_algorithm", "import_xml", "import_xml_text", "XmlLimits", "LEGACY_LIMITS"]
