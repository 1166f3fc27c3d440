"""How each form in which torch passes a call's buffers maps onto a collective spec: the adapters
(``_in_place``, ``_single``, ``_lists``, ``_coalesced``, ``_barrier``, the delegate-only
``_delegate_only`` and ``_point``) turn torch's arguments into the spec's buffers, root and op, and
:func:`install` makes every method torch calls from one row of
:data:`hccc.torch_calls.TORCH_CALLS` (:func:`_method`). The adapters are a mixin of
:class:`~hccc.torch.process_group.HcccProcessGroup`, whose ``_check``, ``_route``, ``_text`` and
``_submit`` they use; every AVG runs through :func:`~hccc.torch.averages.avg_sum`."""
from __future__ import annotations

import functools

import numpy as np
import torch
import torch.distributed as dist

from hccc.compiler.frontend.collectives import OWN, ROOT
from hccc.torch.averages import avg_sum, contiguous, overlap
from hccc.torch.ledger import describe
from hccc.torch.routes import ROUTE_CACHE_MAX, op_name
from hccc.torch.work import HcccWork
from hccc.torch_calls import (BARRIER, COALESCED, DELEGATE_LISTS, IN_PLACE, LISTS, POINT, SINGLE,
                              TORCH_CALLS, TorchCall)

_C = torch._C._distributed_c10d
#: an ``all_to_all_single`` with split sizes is routed (catalog size bands) as an even call of this
#: many elements per rank and block, the same on every rank: its ranks move different byte counts,
#: and every rank must pick the same catalog entry before they exchange their splits. 80640 =
#: 2^8 * 3^2 * 5 * 7, so the call splits into equal pieces for any pieces per block up to 10
#: (the catalog's even-share test); about 2.5 MB of float32 at 8 ranks
UNEVEN_ROUTE_ELEMENTS = 80640


class CallForms:
    """The adapters of torch's call forms (mixed into the process group)."""

    @staticmethod
    def _avg_delegate(backend) -> bool:
        """Whether an AVG on this delegate runs as a SUM here (gloo has no AVG; nccl has)."""
        nccl = getattr(_C, "ProcessGroupNCCL", None)
        return nccl is None or not isinstance(backend, nccl)

    # Every method torch calls is made from one row of :data:`hccc.torch_calls.TORCH_CALLS`
    # (:func:`_method`): the row's form picks the adapter below, which turns torch's arguments into
    # the row's collective's buffers, root and op; the collective's spec says the rest (whether it
    # reduces, has a root, which buffer is the full one, how the two overlay), :func:`_run_spec`
    # runs it on a Communicator and :func:`~hccc.torch.averages.avg_sum` does every AVG.
    def _in_place(self, call: TorchCall, tensors, opts):
        """``(tensors, opts)``: one tensor, the collective's input and output (allreduce,
        broadcast, reduce)."""
        spec = call.spec
        op = op_name(opts) if spec.reduces else None
        root = int(opts.rootRank) if spec.rooted else None
        t = tensors[0]
        # one tensor (the common call): what its shape decides is looked up, not worked out again
        shape = (call.method, op, root, t.dtype, t.device, t.numel(), t.is_contiguous()) \
            if len(tensors) == 1 else None
        got = self._shapes.get(shape) if shape is not None else None
        if got is None:
            dev = self._check(call.name, tensors)
            extra = "several tensors in one call" if len(tensors) != 1 else ""
            route = self._route(call.collective, dev, tensors, t.numel() * t.element_size(), op or "sum",
                                root=root, extra=extra, strided_ok=call.strided)
            got = (dev, route, self._text(call.kind, tensors, op=op, root=root))
            if shape is not None:
                if len(self._shapes) >= ROUTE_CACHE_MAX:
                    self._shapes.clear()
                self._shapes[shape] = got
        else:
            self._check_capture(call.name)      # the tensors' checks passed for this shape
        dev, route, text = got
        n = self._size
        # a rank the result does not reach keeps its buffer (the algorithm may leave partial sums
        # in it): it runs on a copy
        receives = spec.end != ROOT or self._rank == root

        def run_on(c, comm, kop):
            if op == "avg":
                avg_sum(c, c, route[3:5], n, inplace=receives, receives=receives,
                         run_sum=lambda y, _res: _run_spec(comm, spec, y, None, root, kop))
            else:
                _run_spec(comm, spec, c if receives else c.clone(), None, root, kop)

        def run(comm, kop):
            if shape is not None and shape[-1]:     # contiguous: the tensor itself
                run_on(t, comm, kop)
                return
            with contiguous(t) as c:
                run_on(c, comm, kop)

        def delegate(b):
            if op != "avg" or not self._avg_delegate(b):
                return getattr(b, call.delegate_method)(tensors, opts)
            sopts = _sum_options(call, root)
            for x in tensors:
                with contiguous(x) as c:
                    avg_sum(c, c, None, n, inplace=receives,
                             receives=receives,
                             run_sum=lambda y, _res: self._jobs.wait_bounded(
                                 getattr(b, call.delegate_method)([y], sopts), b, "an AVG's SUM"))
            return None
        return self._submit(call.collective, dev, route, run, delegate, tensors, text)

    def _single(self, call: TorchCall, output, input, opts, splits=None):
        """``(output, input, opts)``: one flat tensor per buffer, laid out as the spec's (the
        input the rank's part of the output, or the output the rank's part of the input, may
        overlay it: that input is copied first)."""
        spec = call.spec
        if splits is not None and (splits[0] or splits[1]):
            # split sizes given: an AllToAllv on every rank (a rank whose own splits happen to be
            # equal takes the same route as its peers, whose splits may not be)
            return self._all_to_all_v(call, output, input, splits[0], splits[1], opts)
        dev = self._check(call.name, [input], [output])
        op = op_name(opts) if spec.reduces else None
        n = self._size
        extra = ""
        if spec.alias == "input in output" and output.numel() != input.numel() * n:
            extra = "the output does not hold the group's inputs"
        elif spec.alias == "output in input" and input.numel() != output.numel() * n:
            extra = "the input does not hold the group's outputs"
        elif spec.alias == "same" and input.numel() != output.numel():
            extra = "input and output of different sizes"
        full = output if spec.full_buffer == "output" else input
        route = self._route(call.collective, dev, [full, output if full is input else input],
                            full.numel() * full.element_size(), op or "sum", extra=extra,
                            strided_ok=call.strided)

        def run(comm, kop):
            if op == "avg":
                avg_sum(input, output, route[3:5], n, inplace=False, receives=True,
                         run_sum=lambda y, res: _run_spec(comm, spec, y, res, None, kop))
            else:
                _run_spec(comm, spec, input.clone() if overlap(input, output) else input, output,
                          None, kop)
        rest = ([], []) if call.splits else ()

        def delegate(b):
            run_b = getattr(b, call.delegate_method)
            if op != "avg" or not self._avg_delegate(b):
                return run_b(output, input, *rest, opts)
            sopts = _sum_options(call, None)
            avg_sum(input, output, None, n,
                     inplace=False, receives=True, run_sum=lambda y, res: self._jobs.wait_bounded(
                         run_b(res, y, *rest, sopts), b, "an AVG's SUM"))
            return None
        # the call is described by the rank's own part (the buffer that is not the full one)
        own = output if spec.output == OWN else input
        return self._submit(call.collective, dev, route, run, delegate, [output],
                            self._text(call.kind, [own], op=op))

    def _lists(self, call: TorchCall, output_tensors, input_tensors, opts):
        """``(output_tensors, input_tensors, opts)``: the spec's full buffer as a list of one tensor
        per rank, the rank's own part one tensor (allgather, reduce_scatter, scatter). For a rooted
        collective only the root passes the list, so the route depends only on what every rank
        passes; a root whose list does not fit says so in its call's text, so that every rank's
        call fails on the comparison instead of waiting for the root."""
        spec = call.spec
        n = self._size
        listed_out = spec.output != OWN            # the list is the output (allgather)
        own_list, lists = (input_tensors, output_tensors) if listed_out else (output_tensors, input_tensors)
        pieces = [t for lst in lists for t in lst]
        mine = own_list[0]
        op = op_name(opts) if spec.reduces else None
        root = int(opts.rootRank) if spec.rooted else None
        bad = extra = ""
        if spec.rooted:
            if self._rank == root and (len(lists) != 1 or len(pieces) != n
                                       or any(i.numel() != mine.numel() for i in pieces)):
                bad = (f"the root's {call.method}_list holds {len(pieces)} tensors of "
                       f"{'/'.join(str(i.numel()) for i in pieces) or 'no'} elements")
            elif self._rank == root and any(i.dtype != mine.dtype or i.device != mine.device
                                            for i in pieces):
                bad = (f"the root's {call.method}_list holds tensors of another dtype or device "
                       f"than the {'input' if listed_out else 'output'}")
            extra = "several tensors in one call" if len(own_list) != 1 else bad
            # a bad list goes to the delegate, which refuses it on the root while the others
            # fail on the comparison of the calls
            checked = [] if bad else pieces
        else:
            if len(own_list) != 1 or len(lists) != 1:
                extra = "several tensors in one call"
            elif len(pieces) != n or any(i.numel() != mine.numel() for i in pieces):
                extra = f"{'outputs' if listed_out else 'inputs'} of different sizes"
            elif op == "avg":
                extra = f"op avg of a {call.method} of tensor lists"
            checked = pieces
        dev = self._check(call.name, *((own_list, checked) if listed_out
                                                      else (checked, own_list)))
        route = self._route(call.collective, dev, [mine, *pieces], mine.numel() * mine.element_size() * n,
                            op or "sum", root=root, extra=extra, strided_ok=call.strided)

        def run(comm, kop):
            like = dict(dtype=mine.dtype, device=mine.device)
            if listed_out:
                flat = torch.empty(mine.numel() * n, **like)
                _run_spec(comm, spec, mine.contiguous().view(-1), flat, root, kop)
                for o, piece in zip(pieces, flat.chunk(n)):
                    o.copy_(piece.view_as(o))
                return
            # the full buffer: the list in rank order (a rooted collective's others are never read)
            flat = (torch.cat([i.reshape(-1) for i in pieces]) if not spec.rooted or self._rank == root
                    else torch.empty(mine.numel() * n, **like))
            with contiguous(mine) as c:
                _run_spec(comm, spec, flat, c.view(-1), root, kop)
        # (a rooted collective's list is the root's alone: not counted)
        counts = ([] if spec.rooted else [len(pieces)]) + [x.numel() for x in own_list]
        text = describe(call.kind, op=op, dtype=mine.dtype, counts=counts, root=root,
                        device=mine.device.type, extra=bad)
        return self._submit(call.collective, dev, route, run,
                            lambda b: getattr(b, call.delegate_method)(output_tensors,
                                                                             input_tensors, opts),
                            output_tensors, text)

    def _coalesced(self, call: TorchCall, outputs, inputs, opts):
        """Several tensors in one call: :attr:`TorchCall.repeats` once per tensor (``inputs`` is
        None for an in-place collective)."""
        each = _BY_METHOD[call.repeats]
        if inputs is None:
            one = _options(each)()
            one.reduceOp = opts.reduceOp
            return self._together([getattr(self, each.method)([t], one) for t in outputs], outputs)
        return self._together([getattr(self, each.method)(o, i, opts) for o, i in zip(outputs, inputs)],
                              outputs)

    def _together(self, works, result) -> HcccWork:
        """One work for several queued calls (coalesced calls run as one call per tensor): it
        completes after them (the worker runs calls in order) with the first error, if any."""
        def fn():
            for w in works:
                w.wait()
        return self._enqueue(fn, result)

    def _all_to_all_v(self, call: TorchCall, output, input, output_split_sizes, input_split_sizes, opts):
        """``all_to_all_single`` with uneven split sizes, on the catalog's AllToAll program run as an
        AllToAllv (:meth:`hccc.runtime.Communicator.all_to_all_v`). Each rank knows its own row of
        the counts matrix (its input splits) and column (its output splits): the ranks exchange
        both through the communicator's bootstrap, every rank builds the matrix from the rows and
        checks every rank's column against it, so ranks that disagree all raise (the same verdict
        everywhere) before any data moves. The route is chosen for :data:`UNEVEN_ROUTE_ELEMENTS`, not
        the rank's own bytes, which differ between ranks (the ranks must take one route)."""
        dev = self._check(call.name, [input], [output])
        n = self._size
        rows_in = input.shape[0] if input.dim() else input.numel()
        rows_out = output.shape[0] if output.dim() else output.numel()
        per_in = input.numel() // rows_in if rows_in else 0
        per_out = output.numel() // rows_out if rows_out else 0
        ins = list(input_split_sizes) if input_split_sizes else [rows_in // n] * n
        outs = list(output_split_sizes) if output_split_sizes else [rows_out // n] * n
        if len(ins) != n or len(outs) != n or sum(ins) != rows_in or sum(outs) != rows_out \
                or min(ins + outs) < 0:
            raise ValueError(f"{call.method}: split sizes {ins} / {outs} do not split the input's "
                             f"{rows_in} and the output's {rows_out} rows among {n} ranks")
        extra = "input and output rows of different sizes" if rows_in and rows_out and per_in != per_out else ""
        per = per_in or per_out
        # (torch refuses strided tensors before the backend; were one to arrive, it runs on a
        # contiguous copy: a route that depended on this rank's layout could differ from its peers')
        route = self._route(call.collective, dev, [input, output],
                            UNEVEN_ROUTE_ELEMENTS * n * input.element_size(), "sum", extra=extra,
                            strided_ok=True)
        # the ranks' sizes differ: only the kind and dtype must agree
        text = self._text(f"{call.collective}v", [input], counts=())
        mine = np.array([c * per for c in ins] + [c * per for c in outs], np.int64)

        def run(comm, _op):
            from hccc.runtime.communicator import CommunicatorError
            tag = f"alltoallv/{comm._calls + 1}"
            got = comm._all_gather(mine.tobytes(), tag)
            forget_split_keys(comm, tag)
            table = np.stack([np.frombuffer(g, np.int64) for g in got])
            counts = table[:, :n]
            for d in range(n):
                if not np.array_equal(table[d, n:], counts[:, d]):
                    s = int(np.flatnonzero(table[d, n:] != counts[:, d])[0])
                    raise CommunicatorError(
                        f"rank {self._rank}: {call.method}: rank {d} expects {int(table[d, n + s])} "
                        f"elements from rank {s}, which sends it {int(counts[s, d])} (every rank's "
                        "output_split_sizes must match the senders' input_split_sizes)")
            x = (input.clone(memory_format=torch.contiguous_format) if overlap(input, output)
                 else input.contiguous())
            y = output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
            comm.all_to_all_v(x, y, counts)
            if y is not output:
                output.copy_(y)

        return self._submit(f"{call.collective}v", dev, route, run,
                            lambda b: getattr(b, call.delegate_method)(output, input, list(output_split_sizes or []),
                                                                list(input_split_sizes or []), opts),
                            [output], text)

    def _barrier(self, call: TorchCall, opts):
        """A barrier: a call kind of its own (never taken for a peer's data collective), run as a
        one-element allreduce through hccc when the catalog has one for it."""
        self._check_capture(call.kind)
        t = torch.zeros(1)
        route = self._route(call.kind, t.device, [t], 4, "sum")
        if route[0] == "fallback" and not self.disabled and (
                self.catalog.entries or getattr(self.catalog, "lazy", False)):
            r2 = self._route(call.collective, t.device, [t], 4, "sum")
            route = r2 if r2[0] == "hccc" else route
        spec = call.spec
        return self._submit(call.kind, t.device, route,
                            lambda comm, kop: _run_spec(comm, spec, t, None, 0, kop),
                            lambda b: b.barrier(opts), [t], describe(call.kind))

    def _delegated(self, call: TorchCall, tensors, run_delegate, result, text: str | None):
        """A call hccc has no algorithm kind for: the delegate, counted and logged."""
        dev = self._device(tensors, call.kind) if tensors else torch.device("cpu")
        self._check_capture(call.kind)
        route = ("fallback", f"hccc has no {call.kind} algorithms", None, None, None)
        if self.device_backends.get(dev.type, "hccc") != "hccc":
            route = ("delegated", f"the device map gives {dev.type} to {self.device_backends[dev.type]}",
                     None, None, None)
        return self._submit(call.kind, dev, route, None, run_delegate, result, text)

    def _delegate_only(self, call: TorchCall, output_tensors, input_tensors, opts):
        """``(output_tensors, input_tensors, opts)`` on the delegate. Uneven lists (alltoall of
        tensor lists: a rank's tensors may differ from its peers') are described by how many
        tensors; the others by their sizes (and root)."""
        ins = list(input_tensors)
        root = int(opts.rootRank) if hasattr(opts, "rootRank") else None
        text = self._text(call.kind, ins, root=root,
                          counts=[len(ins)] if call.form == DELEGATE_LISTS else None)
        return self._delegated(call, ins, lambda b: getattr(b, call.method)(output_tensors, input_tensors, opts),
                               output_tensors, text)

    def _point(self, call: TorchCall, tensors, peer, tag):
        """Point-to-point (send, recv) on the delegate; never compared (the ranks make different
        calls)."""
        return self._delegated(call, list(tensors), lambda b: getattr(b, call.method)(tensors, peer, tag),
                               tensors, None)


_BY_METHOD = {c.method: c for c in TORCH_CALLS}


def _options(call: TorchCall):
    """torch's options class of a call."""
    return getattr(_C, call.options)


def _sum_options(call: TorchCall, root: int | None):
    """The call's options for a SUM (an AVG on a delegate without it), with the call's root."""
    sopts = _options(call)()
    sopts.reduceOp = dist.ReduceOp.SUM
    if root is not None:
        sopts.rootRank = root
    return sopts


def _run_spec(comm, spec, x, out, root, kop):
    """Run ``spec``'s collective on a Communicator (its method of the spec's name): input ``x``,
    output ``out`` (None: in place in ``x``), the root where the spec has one, the op where it
    reduces."""
    kw = {}
    if spec.rooted:
        kw["root"] = root
    if spec.reduces:
        kw["op"] = kop
    return getattr(comm, spec.method)(x, out=out, **kw)


def _method(call: TorchCall):
    """The ProcessGroup method of one row of the table: torch's arguments (the options defaulted)
    handed to the adapter of the row's form."""
    def opts_of(opts):
        return opts if opts is not None else _options(call)()

    if call.form == IN_PLACE:
        def method(self, tensors, opts=None):
            return self._in_place(call, tensors, opts_of(opts))
    elif call.form == SINGLE and call.splits:
        def method(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None):
            return self._single(call, output, input, opts_of(opts),
                                (list(output_split_sizes or []), list(input_split_sizes or [])))
    elif call.form == SINGLE:
        def method(self, output, input, opts=None):
            return self._single(call, output, input, opts_of(opts))
    elif call.form == LISTS:
        def method(self, output_tensors, input_tensors, opts=None):
            return self._lists(call, output_tensors, input_tensors, opts_of(opts))
    elif call.form == COALESCED and _BY_METHOD[call.repeats].form == IN_PLACE:
        def method(self, tensors, opts=None):
            return self._coalesced(call, tensors, None, opts_of(opts))
    elif call.form == COALESCED:
        def method(self, outputs, inputs, opts=None):
            return self._coalesced(call, outputs, inputs, opts_of(opts))
    elif call.form == BARRIER:
        def method(self, opts=None):
            return self._barrier(call, opts_of(opts))
    elif call.form == POINT:
        def method(self, tensors, peer, tag=0):
            return self._point(call, tensors, peer, tag)
    else:
        def method(self, output_tensors, input_tensors, opts=None):
            return self._delegate_only(call, output_tensors, input_tensors, opts_of(opts))
    if call.form not in (POINT, COALESCED):
        # (point-to-point calls are not numbered; a coalesced call's are its per-tensor calls)
        method = _numbered_if_refused(call, method)
    method.__name__ = method.__qualname__ = call.method
    method.torch_call = call            # the row it was made from
    method.__doc__ = (f"torch's ``{call.name}``: "
                      + (f"the {call.spec.title} collective ({call.form})" if call.spec is not None
                         else f"on the delegate ({call.form})") + ", from :data:`hccc.torch_calls.TORCH_CALLS`.")
    return method


def _numbered_if_refused(call: TorchCall, method):
    """``method``, whose refusal of a call before queueing it (its checks, its route) still takes
    the call's number (:meth:`~hccc.torch.process_group.HcccProcessGroup._refused`)."""
    @functools.wraps(method)
    def numbered(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            self._refused(call.kind, exc)
            raise
    return numbered


def install(cls) -> None:
    """Give ``cls`` every method of :data:`~hccc.torch_calls.TORCH_CALLS` (and its aliases)."""
    for call in TORCH_CALLS:
        for name in (call.method, *call.aliases):
            setattr(cls, name, _method(call))


def forget_split_keys(comm, tag: str) -> None:
    """Delete this rank's key of the communicator's previous split exchange from the store, so a
    long training run leaves one key per rank there, not one per call: every peer has posted
    ``tag`` by now, which it does only after reading every key of the previous exchange."""
    from hccc.runtime.bootstrap import StoreBootstrap
    boot = getattr(comm, "_boot", None)
    prev = getattr(comm, "_split_tag", None)
    comm._split_tag = tag
    if prev is None or not isinstance(boot, StoreBootstrap) or boot.store is None:
        return
    try:
        boot.store.delete_key(f"{boot.prefix}/{prev}/{boot.rank}")
    except Exception:       # a store without deletion keeps the key: only memory
        pass
