"""AllToAllv for mixture-of-experts token dispatch and combine: hccc's AllToAll programs run with a
Zipf router's per-pair counts, against an equal-count AllToAll of the same total bytes, and against
the delegate (gloo's ``all_to_all_single`` with split sizes, on the CPU).

    python benchmarks/alltoallv.py [--ranks 8,16] [--experts 32] [--tokens 1024,8192] [--hidden 4096]
                                   [--zipf 1.2] [--measure] [--measure-tokens 256] [--iters 5]

Counts: every rank routes ``tokens`` tokens (``hidden`` bfloat16 elements each) top-1 to one of
``experts`` experts, expert ``k`` chosen with probability proportional to ``1/(k+1)^zipf`` (numpy
seed 0 per rank), experts placed ``experts/ranks`` per rank in order; dispatch moves
``counts[s][d]`` = tokens of rank ``s`` for experts on rank ``d`` times ``hidden``, combine the
transpose. The equal AllToAll moves the same total bytes in equal blocks.

Model (always): ``hccc sim``'s alpha-beta model (:mod:`hccc.runtime.sim_alltoallv`) on an example
cluster of each size (8: ``a100_topo1``, 2 nodes x 4 A100; 16: ``a100_topo2``, 2 x 8), for the
direct and the hierarchical AllToAll programs; busbw by nccl-tests' alltoall convention (mean
per-rank size, factor (n-1)/n). ``skew``: the largest pair's share of the bytes; ``hot rank``: how
many times a rank of the equal call the busiest rank sends or receives (:func:`hot_rank`), the
slowdown the counts themselves impose where the ranks' links bound the call, so ``v/equal`` near
``hot rank`` means the program adds nothing of its own to the skew.

Measured (``--measure``, the CPU emulation on this machine, ``--measure-tokens`` tokens of 64
elements, float32): the direct program's kernels as AllToAllv (:meth:`hccc.runtime.launcher.Runner.run_v`)
and as the equal AllToAll (:meth:`~hccc.runtime.launcher.Runner.run`), mean over ``--iters``
launches after one warm-up; and gloo's ``all_to_all_single`` with the same split sizes, one process
a rank, mean over the same number of calls on rank 0. CPU emulation times say how the programs
compare on this machine's cores, not what a GPU would do.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from rank_processes import run_ranks, store_url  # noqa: E402
CLUSTERS = {8: ROOT / "examples" / "clusters" / "a100_topo1.topo",
            16: ROOT / "examples" / "clusters" / "a100_topo2.topo"}
#: bytes of a bfloat16 element (the activations MoE layers move)
BF16_BYTES = 2


def zipf_counts(ranks: int, experts: int, tokens: int, hidden: int, zipf: float, seed: int = 0) -> np.ndarray:
    """The dispatch counts matrix (elements): see the module docstring."""
    w = 1.0 / np.arange(1, experts + 1) ** zipf
    w /= w.sum()
    per = experts // ranks
    c = np.zeros((ranks, ranks), np.int64)
    for s in range(ranks):
        rng = np.random.default_rng(seed * 1000 + s)
        e = rng.choice(experts, size=tokens, p=w)
        c[s] = np.bincount(e // per, minlength=ranks) * hidden
    return c


def equal_counts(c: np.ndarray) -> np.ndarray:
    """An equal-count matrix of (about) the same total."""
    n = len(c)
    return np.full((n, n), max(1, int(c.sum()) // (n * n)), np.int64)


def model_rows(ranks: list[int], experts: int, tokens: list[int], hidden: int, zipf: float) -> list[list[str]]:
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.pipeline import load_cluster
    from hccc.runtime.sim_alltoallv import prepare_v, simulate_v
    rows = []
    for n in ranks:
        topo = load_cluster(str(CLUSTERS[n]))
        g = n // 2
        progs = [build_program(gen.direct_alltoall(n)), build_program(gen.hierarchical_alltoall(2, g))]
        vps = [prepare_v(ir, topo) for ir in progs]
        for t in tokens:
            c = zipf_counts(n, experts, t, hidden, zipf)
            for phase, m in (("dispatch", c), ("combine", c.T.copy())):
                eq = equal_counts(m)
                for ir, vp in zip(progs, vps):
                    v = simulate_v(vp, topo, m, element_bytes=BF16_BYTES)
                    e = simulate_v(vp, topo, eq, element_bytes=BF16_BYTES)
                    rows.append([str(n), ir.name, str(t), phase, _mb(m.sum() * BF16_BYTES),
                                 f"{100 * m.max() / max(1, m.sum()):.1f}%", f"{hot_rank(m):.2f}",
                                 f"{v.time_us:.1f}", f"{e.time_us:.1f}",
                                 f"{v.time_us / e.time_us:.2f}", f"{v.busbw_GBps:.1f}", f"{e.busbw_GBps:.1f}"])
    return rows


def hot_rank(c: np.ndarray) -> float:
    """How much more the busiest rank sends or receives (off its own block) than a rank of the
    equal AllToAll: what the counts alone make the call cost over the equal one, whatever the
    algorithm, when the ranks' links bound it."""
    off = np.asarray(c, np.float64) * (1 - np.eye(len(c)))
    fair = off.sum() / len(c)
    return float(max(off.sum(0).max(), off.sum(1).max()) / fair) if fair else 1.0


def _mb(nbytes) -> str:
    return f"{nbytes / 2 ** 20:.1f}"


# ------------------------------------------------------------------------------ measured
def _gloo_rank(rank: int, world: int, store_dir: str, counts: np.ndarray, iters: int) -> float:
    """This rank's mean time of one gloo ``all_to_all_single`` of ``counts``, in us."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=store_url(store_dir), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    ins, outs = counts[rank].tolist(), counts[:, rank].tolist()
    x = torch.ones(sum(ins))
    y = torch.empty(sum(outs))
    dist.all_to_all_single(y, x, outs, ins)          # warm-up
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_to_all_single(y, x, outs, ins)
    dt = (time.perf_counter() - t0) / iters
    dist.barrier()
    dist.destroy_process_group()
    return dt * 1e6


def gloo_us(counts: np.ndarray, iters: int) -> float:
    """Rank 0's mean time of gloo's ``all_to_all_single`` of ``counts``, one process a rank."""
    return float(run_ranks(_gloo_rank, len(counts), (counts, iters), timeout_s=600)[0])


def measured_rows(ranks: list[int], experts: int, tokens: int, zipf: float, iters: int) -> list[list[str]]:
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.launcher import Runner
    from hccc.runtime.cpu import CpuPlatform
    rows = []
    pf = CpuPlatform()
    for n in ranks:
        ir = build_program(gen.direct_alltoall(n))
        c = zipf_counts(n, experts, tokens, 64, zipf)
        eq = equal_counts(c)
        with Runner(ir, pf, "float32", timeout_s=60.0) as r:
            v = r.run_v(c, iters=iters, warmup=1)
            e = r.run(count=int(eq[0].sum()), iters=iters, warmup=1)
            if not (v.ok and e.ok):
                raise SystemExit(f"{ir.name}: wrong results: {v.stuck or v.first_wrong or e.stuck or e.first_wrong}")
        g = gloo_us(c, iters)
        rows.append([str(n), ir.name, str(tokens), _mb(c.sum() * 4), f"{100 * c.max() / c.sum():.1f}%",
                     f"{v.time_us:.0f}", f"{e.time_us:.0f}", f"{g:.0f}", f"{v.time_us / g:.2f}"])
    return rows


def main(argv=None) -> int:
    from hccc.args import comma_list, positive_int
    from hccc.table import table_lines
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=comma_list(positive_int, "ranks"), default=[8, 16])
    ap.add_argument("--experts", type=positive_int, default=32)
    ap.add_argument("--tokens", type=comma_list(positive_int, "tokens"), default=[1024, 8192])
    ap.add_argument("--hidden", type=positive_int, default=4096)
    ap.add_argument("--zipf", type=float, default=1.2)
    ap.add_argument("--measure", action="store_true", help="also run the CPU emulation and gloo")
    ap.add_argument("--measure-tokens", type=positive_int, default=256)
    ap.add_argument("--iters", type=positive_int, default=5)
    a = ap.parse_args(argv)
    for n in a.ranks:
        if n not in CLUSTERS:
            ap.error(f"--ranks: {n}: the model has clusters of {', '.join(map(str, CLUSTERS))} ranks")
        if a.experts % n:
            ap.error(f"--experts {a.experts} is not a multiple of {n} ranks")
    print(f"# MoE AllToAllv, model: {a.experts} experts, Zipf({a.zipf}) top-1 router, hidden {a.hidden}, "
          "bfloat16; v = the router's counts, equal = equal blocks of the same total bytes")
    heads = ["ranks", "program", "tokens", "phase", "MiB", "skew", "hot rank", "v us", "equal us", "v/equal",
             "v busbw", "equal busbw"]
    for ln in table_lines(heads, model_rows(a.ranks, a.experts, a.tokens, a.hidden, a.zipf),
                          right=set(range(2, len(heads))) - {3}):
        print(ln)
    if a.measure:
        print()
        print(f"# measured on this machine: CPU emulation of the kernels vs gloo, {a.measure_tokens} tokens "
              f"of 64 float32 per rank, mean of {a.iters} calls")
        heads = ["ranks", "program", "tokens", "MiB", "skew", "hccc v us", "hccc equal us", "gloo v us",
                 "hccc/gloo"]
        for ln in table_lines(heads, measured_rows(a.ranks, a.experts, a.measure_tokens, a.zipf, a.iters),
                              right=set(range(2, len(heads)))):
            print(ln)
    return 0


if __name__ == "__main__":
    sys.exit(main())
