"""Test helper run as a script: one rank of a multi-node job (CPU emulation), for tests that start
each node's processes in an environment of their own (a mount namespace with a private /dev/shm).

    python net_worker.py JOB.json RANK

JOB.json: ``ir`` (ProgramIR JSON text), ``world``, ``url`` (bootstrap), ``nodes`` (node per rank),
``count``, ``dtype``, ``op``, ``seed``, ``out`` (directory). Writes ``OUT/RANK.npy`` (the output) or
``OUT/RANK.err`` (the error)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    rank = int(sys.argv[2])
    out = Path(job["out"])
    try:
        from hccc.compiler.ir.check import load_ir_json
        from hccc.runtime import reference
        from hccc.runtime.communicator import Communicator, METHODS
        ir = load_ir_json(job["ir"])
        coll, count = ir.collective, int(job["count"])
        inputs = reference.make_inputs(coll, ir.nranks, count, job["dtype"], nchunks=ir.nchunks,
                                       seed=job["seed"])
        want = reference.expected(coll, inputs, job["op"], nchunks=ir.nchunks, root=ir.root)
        x = np.array(inputs[rank], copy=True)
        with Communicator(ir, rank=rank, world_size=job["world"], init_method=job["url"],
                          node=job["nodes"][rank], timeout_s=30, dtype=job["dtype"],
                          op=job["op"]) as comm:
            method = METHODS[coll]
            if coll in ("allgather", "alltoall", "reducescatter"):
                res = np.zeros(len(want[rank]), dtype=x.dtype)
                getattr(comm, method)(x, res)
            elif coll in ("allreduce", "reduce"):
                res = getattr(comm, method)(x, op=job["op"])
            else:
                res = getattr(comm, method)(x)
            puts = comm._net.tx.counters() if comm._net is not None else (0, 0)
        np.save(out / f"{rank}.npy", np.asarray(res))
        (out / f"{rank}.puts").write_text(json.dumps(puts))
        return 0
    except BaseException as exc:
        (out / f"{rank}.err").write_text(f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
