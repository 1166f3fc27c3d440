#!/usr/bin/env python3
"""Write one page per ``hccc`` command into this folder: what it is for, its options (the command's
own ``--help``, so the page cannot drift from the code) and an example with its real output.

    python docs/commands/generate.py            # (re)write the pages (run from anywhere)
    python docs/commands/generate.py --rerun-timed   # also rerun the examples whose output has timings
    python docs/commands/generate.py --check    # exit 1 if a page's options are out of date

The examples run from the repository root in a scratch directory for their outputs. The outputs of
``run``, ``fuzz`` and ``synth`` hold timings of the machine that made them: a plain run keeps the
output a page already shows for those (so the pages only change when the code does), and
``--rerun-timed`` refreshes them. Help text is wrapped at 100 columns.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

#: command -> (what it is for, example command lines; OUT is a scratch directory)
PAGES = {
    "compile": ("The main form, `hccc ALGO -o OUTDIR`: verify, schedule (HPDS), lower and allocate thread "
                "blocks, then write one CUDA (or HIP) source per rank, the headers, `manifest.json`, the "
                "ProgramIR as JSON, the MSCCL XML export, a `CMakeLists.txt` and a `Makefile`. The output "
                "directory is replaced atomically; a failed compile leaves it untouched. `hccc compile ALGO "
                "-o OUTDIR` is the same. `--dump-after STAGE -o FILE` stops after a stage of the compile "
                "(algorithm, dag, schedule, lowered, program-ir) and writes what it made instead: the algorithm "
                "as ResCCLang, the DAG and the schedule as JSON, the programs as ProgramIR JSON (an input "
                "again).",
                ["hccc examples/hm_allreduce_2x4.rccl -o OUT/kernels --topology examples/clusters/a100_topo1.topo",
                 "hccc examples/ring_sendrecv_8.rccl --dump-after algorithm -o -"]),
    "check": ("Prove that an algorithm implements its collective (and, with `--topology`, fits the "
              "cluster); bad programs get `file:line:col: error:` diagnostics.",
              ["hccc check examples/hm_allreduce_4x8.rccl", "hccc check examples/ring_scatter_8.rccl"]),
    "run": ("Build the emitted kernels (CPU emulation with g++, or CUDA / HIP on a GPU), run them at each "
            "size out of place and in place, and compare every element with the reference executor. "
            "Options and table follow nccl-tests (`-b/-e/-f`, `-n/-w`, `-d`, `-o`, `-r`).",
            ["hccc run examples/ring_allgather_8.rccl -b 1K -e 16K -f 4 -n 1 -w 0",
             "hccc run examples/ring_scatter_8.rccl -b 1K -e 16K -f 4 -n 1 -w 0"]),
    "fuzz": ("Random sizes, dtypes, operators, placements and threads per block through the kernels and "
             "the reference executor; the first failure is shrunk to a `hccc run` command.",
             ["hccc fuzz examples/ring_allgather_8.rccl --examples 4 -d int32 -o sum"]),
    "sim": ("Simulate programs on a cluster with the alpha-beta model; nccl-tests table per program and "
            "scheduler, `--plot-busbw` for bus bandwidth against size, `--plot` for a timeline; `--counts FILE` "
            "runs an AllToAll program as one AllToAllv call of a counts matrix ([../alltoallv.md](../alltoallv.md)).",
            ["hccc sim examples/hm_allreduce_2x4.rccl --topology examples/clusters/a100_topo1.topo -b 1M -e 64M -f 8",
             "hccc sim examples/ring_scatter_8.rccl --topology examples/clusters/a100_topo1.topo -b 1M -e 64M -f 8",
             "hccc sim examples/direct_alltoall_8.rccl --topology examples/clusters/a100_topo1.topo "
             "--counts examples/alltoallv/moe_dispatch_8.txt"]),
    "topo": ("Summarise a cluster description: nodes, vendors, link classes with HeteCCL's logical "
             "capacities, shared groups and the vendor hierarchy. Or make one from what the machine "
             "knows: NCCL's topology dump (`--from-nccl`, the XML `NCCL_TOPO_DUMP_FILE` writes), the saved "
             "output of `nvidia-smi topo -m` (`--from-smi`), or NVML on this machine (`--detect`, needs "
             "`pip install 'hccc[detect]'`); one file per node, in rank order. The `.topo` written is "
             "parsed back before it is written; its comments say what each node is and what was assumed "
             "([../topology-import.md](../topology-import.md)).",
             ["hccc topo examples/clusters/heteccl_fig10.topo",
              "hccc topo --from-nccl tests/topo_dumps/two_nics.xml"]),
    "synth": ("Synthesise a schedule for a collective on a cluster and write it as ResCCLang: spanning-tree "
              "packing at the bandwidth optimum for large messages, or the step search (greedy, repaired and "
              "shortened with z3 within the time limit) for small ones (docs/synthesis.md).",
              ["hccc synth examples/clusters/a100_topo1.topo --collective allgather -o OUT/ag.rccl --time-limit 20",
               "hccc synth examples/clusters/a100_topo1.topo --collective allgather --method search -o OUT/ag_s.rccl "
               "--time-limit 20"]),
    "gen": ("Generate algorithms: `c2c` writes HetCCL's cluster-to-cluster collectives for mixed-vendor "
            "clusters.",
            ["hccc gen c2c examples/clusters/mixed_v100_w7800.topo --collective allgather -o OUT/c2c_ag.rccl"]),
    "xml": ("Export an algorithm as MSCCL XML for the MSCCL executor and RCCL, within the runtime's "
            "limits. AllGather, ReduceScatter, AllReduce and AllToAll: an MSCCL `<algo>` has no root, so "
            "a Broadcast, Reduce, Gather or Scatter is refused at its header with that reason.",
            ["hccc xml examples/ring_allgather_8.rccl -o OUT/ring_allgather_8.xml"]),
    "plan": ("Export an algorithm as an MSCCL++ execution plan for the MSCCL++ executor and its NCCL-API "
             "shim (docs/mscclpp.md), within the executor's limits. AllGather, ReduceScatter, AllReduce "
             "and AllToAll: the executor's plans have no root, so a Broadcast, Reduce, Gather or Scatter "
             "is refused at its header with that reason.",
             ["hccc plan examples/hm_allreduce_2x4.rccl -o OUT/hm_allreduce_2x4.mscclpp.json"]),
    "balance": ("Split a batch over GPUs of different measured speeds (HetCCL-SNU section 4.5).",
                ["hccc balance --speeds 2.1,1.0,1.0 --batch 64"]),
    "catalog": ("List what an algorithm catalog -- the directory the torch.distributed backend picks its "
                "algorithms from (`HCCC_ALGO_DIR`, see [../torch.md](../torch.md)) -- covers: each entry's "
                "collective, world size, root, dtypes, ops and size band, then the sizes and collectives no "
                "entry covers (those calls fall back to the delegate backend).",
                ["hccc catalog examples/torch/catalog4"]),
}


#: commands whose example output holds timings of the machine
TIMED = ("run", "fuzz", "synth")


def shown_outputs(text: str) -> dict[str, str]:
    """example line -> the output a page shows for it."""
    return {m.group(1): m.group(2) for m in re.finditer(r"```sh\n(.*?)\n```\n\n```text\n(.*?)\n```", text, re.S)}


def help_text(name: str) -> str:
    from hccc.cli import command_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return command_parser(name).format_help().rstrip()
    finally:
        if old is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = old


def run_example(line: str, scratch: Path) -> tuple[int, str]:
    """Run one example line in-process (from the repository root); (exit status, stdout)."""
    from hccc.cli import main

    argv = [a.replace("OUT", str(scratch)) for a in shlex.split(line)[1:]]
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            rc = main(argv)
    finally:
        os.chdir(cwd)
    return rc, out.getvalue().replace(str(scratch), "OUT").rstrip()


def page(name: str, outputs: dict[str, str] | None) -> str:
    what, examples = PAGES[name]
    title = "hccc ALGO -o OUTDIR" if name == "compile" else f"hccc {name}"
    parts = [f"# `{title}`", "", what, "", "## Options", "", "```text", help_text(name), "```", "",
             "## Example", ""]
    for line in examples:
        parts += ["```sh", line, "```", ""]
        if outputs is not None:
            parts += ["```text", outputs[line], "```", ""]
    return "\n".join(parts)


def options_section(text: str) -> str:
    m = re.search(r"## Options\n\n```text\n(.*?)\n```", text, re.S)
    return m.group(1) if m else ""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a page's options are out of date")
    ap.add_argument("--rerun-timed", action="store_true", help="rerun the examples whose output has timings")
    args = ap.parse_args(argv)
    if args.check:
        stale = [n for n in PAGES if not (HERE / f"{n}.md").is_file()
                 or options_section((HERE / f"{n}.md").read_text()) != help_text(n)]
        for n in stale:
            print(f"docs/commands/{n}.md is out of date (run python docs/commands/generate.py)")
        return 1 if stale else 0
    os.environ.setdefault("HCCC_CPU_OPT", "-O0")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, examples) in PAGES.items():
            outputs = {}
            path = HERE / f"{name}.md"
            kept = shown_outputs(path.read_text()) if path.is_file() and name in TIMED and not args.rerun_timed else {}
            for line in examples:
                if line in kept:
                    outputs[line] = kept[line]
                    continue
                rc, out = run_example(line, Path(tmp))
                if rc != 0:
                    print(f"{line}: exit status {rc}", file=sys.stderr)
                    return 1
                outputs[line] = out
            (HERE / f"{name}.md").write_text(page(name, outputs))
    index = ["# Commands", "", "One page per command: what it does, its options, an example with its output.",
             "The tutorial ([../tutorial.md](../tutorial.md)) uses them together.", ""]
    from hccc.cli import SUMMARIES
    for name in PAGES:
        title = "hccc ALGO -o OUTDIR" if name == "compile" else f"hccc {name}"
        index.append(f"- [`{title}`]({name}.md): {SUMMARIES[name]}")
    (HERE / "README.md").write_text("\n".join(index) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
