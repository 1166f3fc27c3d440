"""Fused LL chains (docs/kernel-protocol.md "Fused LL chains"): consecutive fused primitives of a
thread block on one pair of connections run, under LL, in the data threads line by line, every
micro-batch of each, handed over once (hccc_chain_enter, hccc_chain_prepare in hccc_prims.h).

* the emitted kernels on the CPU emulation compute what the reference executor computes, for
  random valid programs of every collective lowered with fusion, under LL (uneven counts, dtypes,
  operators, in and out of place, 1 to 3 channels, both code-generation modes, threads per block
  from one data thread to several warps of the emulated width);
* where chains form, recomputed from the primitive table with plain loops here
  (:func:`chains_of`), against the kernel cost model's reading of the same rule
  (:func:`hccc.runtime.kernel_time.ll_chains`);
* the model: a chain's units cost their lines alone, its hand-over one unit's fixed cost off the
  path (it waits for no data), by hand on the fused ring AllReduce;
* the marks codegen emits (``hccc_pd::chain``, hccc.compiler.ir.ll_chains) are the chains found
  here, and the CPU emulation, which compiles the CUDA build's chain code, hands its data threads
  one descriptor per chain (traced through a test build's ``HCCC_TEST_CHAIN_HOOK``).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as gen
from hccc.compiler.ir.program_ir import Op
from hccc.compiler.passes.build import build_program
from hccc.testing import describe_failure, kernel_cases, run_case, valid_programs

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

FUSED = {int(Op.RECV_COPY_SEND), int(Op.RECV_REDUCE_SEND), int(Op.RECV_REDUCE_COPY_SEND)}
#: the engine's HCCC_CHAIN_PRIMS, HCCC_CHAIN_PIECES and HCCC_NSLOTS
CHAIN_PRIMS, CHAIN_PIECES, NSLOTS = 8, 1, 8


def chains_of(ir, m: int = 1) -> list[list[int]]:
    """The chains the engine forms under LL (no direct receives) at m micro-batches a primitive,
    row by row: where m is at most NSLOTS, a fused primitive of CHAIN_PIECES chunk that awaits no
    dependency and that none awaits starts one, and the rows after it in its thread block join
    while they are such primitives on the same receive and send connections, up to CHAIN_PRIMS
    rows and NSLOTS units (rows x m)."""
    if m > NSLOTS:
        return []
    p = {k: v.tolist() for k, v in ir.prims.items()}
    waiting = set(np.asarray(ir.dep_prim).tolist()) | set(np.asarray(ir.dep_on).tolist())
    most = min(CHAIN_PRIMS, NSLOTS // m)

    def linkable(i):
        return p["op"][i] in FUSED and 1 <= p["count"][i] <= CHAIN_PIECES and i not in waiting
    out, i, n = [], 0, ir.nprims
    while i < n:
        if not linkable(i):
            i += 1
            continue
        chain = [i]
        j = i + 1
        while (j < n and len(chain) < most and linkable(j)
               and (p["rank"][j], p["tb"][j]) == (p["rank"][i], p["tb"][i])
               and (p["recv_peer"][j], p["send_peer"][j], p["channel"][j]) == (p["recv_peer"][i], p["send_peer"][i], p["channel"][i])):
            chain.append(j)
            j += 1
        out.append(chain)
        i = j
    return out


@settings(max_examples=30, deadline=None)
@given(valid_programs(max_ranks=6), st.integers(1, 10))
def test_the_models_chains_are_the_engines_rule(alg, m):
    from hccc.runtime.kernel_time import ll_chains
    ir = build_program(alg, fuse=True)
    assert [list(c) for c in ll_chains(ir, m)] == chains_of(ir, m)


def test_the_fused_ring_runs_as_chains():
    """Ring AllReduce 8 fused: every fused primitive is in a chain, each block's reduce-forward then
    forward of its chunk (the lowering gives each chunk's fused traffic a block of its own)."""
    ir = build_program(gen.ring_allreduce(8), fuse=True)
    chains = chains_of(ir)
    fused = [i for i in range(ir.nprims) if int(ir.prims["op"][i]) in FUSED]
    assert sorted(i for c in chains for i in c) == fused
    assert all([int(ir.prims["op"][i]) for i in c] == [int(Op.RECV_REDUCE_COPY_SEND), int(Op.RECV_COPY_SEND)]
               for c in chains)


def _flat(c, hop_us):
    from hccc.compiler.passes import kernel_cost as kc
    return kc.KernelCosts(unit_us={k: (c,) for k in ("COPY", "SEND", "RECV", "RECV_REDUCE_COPY")}, warps=(16,),
                          flag_round_trip_us=2 * hop_us, launch_per_block_s=0.0, hbm_bytes_per_s=1e30, flat_gbs=1e9)


@pytest.mark.parametrize("n", [3, 8])
def test_a_chain_costs_its_hand_over_off_the_path(n):
    """The model, by hand: ring AllReduce n fused under LL at one micro-batch is a send, n - 1 hops
    through n - 2 ranks' chains, the reduce of the rank's own chunk, a dependency to the send that
    starts the AllGather, n - 1 hops through chains again, the last receive: 4 units and
    2(n - 1) + 1 hops, every chain handed over before its data arrives (no unit cost); unfused,
    every receive on the path is a unit."""
    from hccc.runtime import kernel_time as kt
    c, hop = 0.3, 0.4
    fused = build_program(gen.ring_allreduce(n), fuse=True)
    plain = build_program(gen.ring_allreduce(n))
    nb = 16 * n
    t = kt.program_time(fused, nb, _flat(c, hop), slice_bytes=nb, warps=16, proto="ll")
    assert t.micro_batches == 1
    assert t.path * 1e6 == pytest.approx(4 * c + (2 * (n - 1) + 1) * hop, rel=1e-9)
    u = kt.program_time(plain, nb, _flat(c, hop), slice_bytes=nb, warps=16, proto="ll")
    assert u.path * 1e6 >= (2 * (n - 1) + 1) * (c + hop) - 1e-9
    s = kt.program_time(fused, nb, _flat(c, hop), slice_bytes=nb, warps=16, proto="simple", direct=False)
    assert s.path > t.path


@needs_gxx
@pytest.mark.parametrize("make,k,threads", [(lambda: gen.ring_allreduce(4), 1, 3),
                                            (lambda: gen.ring_allreduce(5), 2, 1),
                                            (lambda: gen.ring_allgather(4), 3, 9),
                                            (lambda: gen.ring_reducescatter(3), 1, 2)])
def test_fixed_fused_programs_under_ll_match_the_reference(make, k, threads):
    from hccc.compiler.passes.channels import with_channels
    from hccc.testing import KernelCase
    ir = with_channels(build_program(make(), fuse=True, chunk_bytes=256), k)
    assert chains_of(ir)
    for codegen in ("specialized", "table"):
        for count, dtype, op in ((1, "float32", "sum"), (ir.nchunks * 37 + 3, "float16", "avg"),
                                 (ir.nchunks * 400 + 1, "int32", "max"), (ir.nchunks * 1000, "bfloat16", "prod")):
            for inplace in (False, True):
                case = KernelCase(count, dtype, op, inplace, threads)
                res = run_case(ir, case, codegen=codegen, proto="ll", timeout_s=30)
                assert res.ok and res.proto == "ll", (codegen, describe_failure(case, res))


@needs_gxx
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_fused_programs_under_ll_match_the_reference(data):
    from hccc.compiler.passes.channels import with_channels
    alg = data.draw(valid_programs(["allgather", "reducescatter", "allreduce", "broadcast", "reduce"], max_ranks=5),
                    label="program")
    ir = build_program(alg, fuse=True, chunk_bytes=192)
    ir = with_channels(ir, data.draw(st.integers(1, 3), label="channels"))
    case = data.draw(kernel_cases(ir, max_microbatches=12, threads=(1, 2, 5)), label="case")
    codegen = data.draw(st.sampled_from(["specialized", "table"]), label="codegen")
    res = run_case(ir, case, codegen=codegen, proto="ll", timeout_s=30)
    assert res.ok, (codegen, ir.nchannels, describe_failure(case, res))


def _marks_of(chains, n: int) -> list[int]:
    """The marks codegen gives rows whose runs are ``chains`` (each at most CHAIN_PRIMS rows, so a
    run is one chain): the chain's rows from each on, 0 outside every chain."""
    out = [0] * n
    for c in chains:
        for j in c:
            out[j] = c[-1] + 1 - j
    return out


def test_codegen_marks_the_chain_rows_in_the_emitted_program(tmp_path):
    """The fused ring AllReduce 8's emitted rows (every rank's source): a chain's rows carry the
    chain's rows from each on (``HCCC_P*G``'s last argument, the comment's ``LL chain of K rows
    on``), every other row none, as chains_of finds them."""
    import re
    from hccc.compiler.backend.codegen import generate
    ir = build_program(gen.ring_allreduce(8), fuse=True)
    chains = chains_of(ir)
    assert chains and all(len(c) <= CHAIN_PRIMS for c in chains)
    want = _marks_of(chains, ir.nprims)
    generate(ir, tmp_path, platforms=["cuda"] * ir.nranks)
    got = []
    for r in range(ir.nranks):
        text = next(tmp_path.glob(f"*_r{r}.c*")).read_text()
        rows = [x for x in text.splitlines() if re.match(r"\s+HCCC_P\w*\(", x)]
        got += [int(m.group(1)) if (m := re.search(r"LL chain of (\d+) rows on", x)) else 0 for x in rows]
    assert got == want


@needs_gxx
def test_the_emitted_header_builds_chains_in_on_the_platforms_that_run_them(tmp_path):
    """hccc_prims.h's HCCC_LL_CHAINS, as the preprocessor sees it for each platform's build (the CPU
    emulation, CUDA, HIP: the macros that tell them apart), is 1 exactly on
    ll_chains.CHAIN_PLATFORMS (the CPU emulation, CUDA and HIP), and a build may set it; the table
    mode's generic GPU kernels leave chains out (hccc_table.h: no decoded table)."""
    import re
    import subprocess
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.ir.ll_chains import CHAIN_PLATFORMS
    assert set(CHAIN_PLATFORMS) == {"cpu", "cuda", "hip"}
    ir = build_program(gen.ring_allreduce(4), fuse=True)
    generate(ir, tmp_path, platforms=["cuda"] * ir.nranks)
    text = (tmp_path / "hccc_prims.h").read_text()
    block = re.search(r"^#ifndef HCCC_LL_CHAINS\n.*?^#endif\n#endif\n", text, flags=re.M | re.S)
    assert block, "no HCCC_LL_CHAINS block in hccc_prims.h"
    probe = tmp_path / "probe.h"
    probe.write_text(block.group(0) + "int hccc_ll_chains_is = HCCC_LL_CHAINS;\n")

    def value(*defines: str) -> int:
        out = subprocess.run(["g++", "-E", "-P", *defines, str(probe)], capture_output=True, text=True,
                             check=True).stdout
        return int(re.search(r"hccc_ll_chains_is = (\d+);", out).group(1))

    macros = {"cpu": ("-DHCCC_PLATFORM_CPU",), "cuda": ("-D__CUDACC__",), "hip": ("-D__HIPCC__",)}
    assert {p: value(*d) for p, d in macros.items()} == {"cpu": 1, "cuda": 1, "hip": 1}
    assert value("-D__CUDACC__", "-DHCCC_LL_CHAINS=0") == 0 and value("-D__HIPCC__", "-DHCCC_LL_CHAINS=0") == 0
    from hccc.compiler.backend.table_codegen import generate_table
    (tmp_path / "table").mkdir()
    generate_table(ir, tmp_path / "table", platforms=["cuda"] * ir.nranks)
    before = (tmp_path / "table" / "hccc_table.h").read_text().split('#include "hccc_prims.h"')[0]
    probe.write_text(before + block.group(0) + "int hccc_ll_chains_is = HCCC_LL_CHAINS;\n#endif\n")
    assert value("-D__CUDACC__") == 0 and value("-D__HIPCC__") == 0 and value("-DHCCC_PLATFORM_CPU") == 1


@pytest.fixture(scope="module")
def chain_traced(tmp_path_factory):
    """A CPU platform whose engine writes a line to stderr for every chain it hands to the data
    threads (``HCCC_TEST_CHAIN_HOOK``: its links and units); otherwise the build every test runs."""
    from hccc.runtime import cpu, cpu_build
    mp = pytest.MonkeyPatch()
    mp.setattr(cpu_build, "_CXX_FLAGS", [*cpu_build._CXX_FLAGS,
                                         '-DHCCC_TEST_CHAIN_HOOK(l,u)=fprintf(stderr,"hccc-chain %u %u\\n",l,u)'])
    plat = cpu.CpuPlatform(cache_dir=tmp_path_factory.mktemp("chain-hook"))
    try:
        yield plat
    finally:
        plat.close()
        mp.undo()


@needs_gxx
@pytest.mark.parametrize("n,channels", [(4, 1), (5, 2)])
def test_the_emulation_runs_every_marked_chain_as_one_descriptor(chain_traced, capfd, n, channels):
    """The CPU emulation compiles the GPU builds' chain code (HCCC_LL_CHAINS 1 in all: ll_chains.CHAIN_PLATFORMS)
    and runs it: fused ring AllReduce n under LL at one micro-batch hands the data threads one
    descriptor per chain chains_of finds (its links and units), in every block of every channel,
    and computes the reference; under Simple, none."""
    from hccc.compiler.passes.channels import with_channels
    from hccc.testing import KernelCase
    ir = with_channels(build_program(gen.ring_allreduce(n), fuse=True, chunk_bytes=256), channels)
    chains = chains_of(ir)
    assert chains
    case = KernelCase(ir.nchunks * 4, "float32", "sum", False, 3)   # 16 B a chunk: one micro-batch
    capfd.readouterr()
    res = run_case(ir, case, backend=chain_traced, proto="ll", timeout_s=30)
    assert res.ok and res.proto == "ll", describe_failure(case, res)
    seen = sorted(tuple(int(v) for v in x.split()[1:]) for x in capfd.readouterr().err.splitlines()
                  if x.startswith("hccc-chain "))
    assert seen == sorted((len(c), len(c)) for c in chains for _ in range(channels))
    res = run_case(ir, case, backend=chain_traced, proto="simple", timeout_s=30)
    assert res.ok, describe_failure(case, res)
    assert "hccc-chain" not in capfd.readouterr().err


@needs_gxx
def test_an_alltoall_program_runs_no_chain_and_the_model_counts_none(chain_traced, capfd):
    """Fused ring AllToAll 4 has marked rows (codegen marks its forwards) and a decoded table
    (prim_table.ALLTOALL_TABLE), but its engine has no chain code (hccc_chains_of: an AllToAll
    program's templates are rounds of the counts): under LL the emulation hands its data threads no
    chain and computes the reference, and the kernel cost model (kernel_time.chain_units) counts
    none either."""
    from hccc.compiler.backend import prim_table
    from hccc.compiler.ir.ll_chains import chain_rows
    from hccc.runtime.kernel_time import chain_units
    from hccc.testing import KernelCase
    ir = build_program(gen.ring_alltoall(4), fuse=True, chunk_bytes=256)
    assert chain_rows(ir).any() and chains_of(ir) and prim_table.ptable_prims(ir) > 0
    assert not chain_units(ir, "ll")
    case = KernelCase(ir.nchunks * 4, "float32", "sum", False, 3)   # one micro-batch, as above
    capfd.readouterr()
    res = run_case(ir, case, backend=chain_traced, proto="ll", timeout_s=30)
    assert res.ok and res.proto == "ll", describe_failure(case, res)
    assert "hccc-chain" not in capfd.readouterr().err
