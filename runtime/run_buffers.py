"""One single-process run's size-dependent memory (:class:`~hccc.runtime.launcher.Runner`): every
rank's input, output and scratch buffers, laid out as :func:`~hccc.runtime.launcher.program_layout`
says (in place: one buffer, the other at its offset in it), and what the run stages in a rank's
memory besides (an AllToAllv call's counts and tables, the direct-mode peers array), each in its
rank's platform memory and device. A launch refills them (:meth:`RunBuffers.fill`: outputs and
scratch to garbage, so an element never written shows up, then the inputs) and the oracle reads
the outputs back (:meth:`RunBuffers.outputs`).
"""
from __future__ import annotations

import numpy as np

from hccc.runtime import oracle


class RunBuffers:
    """The buffers of one run of the ranks whose platforms are ``rank_pf`` and devices
    ``placement``, of ``dtype`` elements. ``self[r]`` is rank ``r``'s (input, output, scratch,
    [what to free])."""

    def __init__(self, rank_pf, placement, dtype: str):
        self.rank_pf, self.placement, self.dtype = rank_pf, placement, dtype
        self.bufs: list[tuple[int, int, int, list[int]]] = []

    def __getitem__(self, rank: int):
        return self.bufs[rank]

    def __len__(self) -> int:
        return len(self.bufs)

    def _pf(self, rank: int):
        pf = self.rank_pf[rank]
        pf.set_device(self.placement[rank])
        return pf

    def alloc(self, lay, inplace: bool, es: int) -> None:
        """Each rank's input, output and scratch, allocated in rank order (a failure leaves here
        what :meth:`free` must free). ``lay``: layout rows (elements in, out, scratch; in place,
        the input's or the output's offset in the other, or -1)."""
        for r in range(len(self.rank_pf)):
            pf = self._pf(r)
            n_in, n_out, n_scr, in_off, out_off = lay[r]
            own: list[int] = []
            self.bufs.append((0, 0, 0, own))          # freed as allocated, should the next fail

            def keep(n: int) -> int:
                own.append(pf.malloc(max(n * es, 16)))
                return own[-1]

            if inplace and in_off >= 0:
                out_p = keep(n_out)
                in_p = out_p + in_off * es
            elif inplace:
                in_p = keep(n_in)
                out_p = in_p + out_off * es
            else:
                in_p, out_p = keep(n_in), keep(n_out)
            self.bufs[-1] = (in_p, out_p, keep(n_scr), own)

    def stage(self, rank: int, host: np.ndarray | None) -> int:
        """``host`` copied into ``rank``'s memory for this run (freed with its buffers); 0 for None."""
        if host is None:
            return 0
        pf = self._pf(rank)
        ptr = pf.malloc(max(host.nbytes, 16))
        self.bufs[rank][3].append(ptr)
        if host.nbytes:
            pf.memcpy_htod(ptr, host)
        return ptr

    def fill(self, lay, dev_inputs) -> None:
        """Outputs and scratch to garbage (:data:`hccc.runtime.oracle.GARBAGE`), then the inputs
        (after the output's garbage: in place, they overlay)."""
        g, ddt = oracle.GARBAGE[self.dtype], np.dtype(oracle.DEVICE_DTYPE[self.dtype])
        for r, (in_p, out_p, scr_p, _) in enumerate(self.bufs):
            pf = self.rank_pf[r]
            n_in, n_out, n_scr = lay[r][:3]
            if n_out:
                pf.memcpy_htod(out_p, np.full(n_out, g, dtype=ddt))
            if n_scr:
                pf.memcpy_htod(scr_p, np.full(n_scr, g, dtype=ddt))
            if n_in:
                pf.memcpy_htod(in_p, dev_inputs[r])

    def outputs(self, lens) -> list[np.ndarray]:
        """Each rank's output buffer (``lens[r]`` elements) back on the host, as the oracle sees it."""
        ddt = np.dtype(oracle.DEVICE_DTYPE[self.dtype])
        got = []
        for r, b in enumerate(self.bufs):
            host = np.empty(int(lens[r]), dtype=ddt)
            self._pf(r).memcpy_dtoh(host, b[1])
            got.append(oracle.from_device(host, self.dtype))
        return got

    def free(self) -> None:
        """Free what the run allocated for every rank."""
        for r, b in enumerate(self.bufs):
            for ptr in b[3]:
                self.rank_pf[r].free(ptr)
        self.bufs = []


__all__ = ["RunBuffers"]
