"""Record one GPU run for the kernel cost model, from the report ``gpu_validate.py --quick --json``
wrote on the lent machine:

    python benchmarks/record_gpu_run.py gpu_out/gpu_validate.json --run sixth \
        --section "The sixth GPU run" [--kernels v5] [--dry-run]

writes ``benchmarks/recorded/runs/<run>.json`` (``kernel_model.RECORDED_RUNS``), which
``benchmarks/kernel_model.py --recorded`` reads after ``recorded/gpu_runs.json``:

- ``card`` and ``sms``: the environment step's GPU (its model, as "H100" or "H200", or the whole
  name) and multiprocessors;
- ``units``: ``hbm_tbs``, the device copy step's read + write rate, and ``anatomy``, the slot
  anatomy step's rows, from which the model takes every unit-level figure of the run
  (``kernel_model.costs_from_anatomy``: units, flag round trip, copy table, launches by blocks);
- ``rows``: every timed ``hccc run`` row of the latency, bandwidth, HM, examples and pathology
  steps that came back right (no wrong element, not stuck), as ``{program, bytes, proto,
  placement, slice, fuse, us}``; a program that is not one of ``examples/`` is kept with
  ``not_in_repository``. A row measured twice keeps its first time. Rows left out are listed.

Then it prints the run's rows beside the model's prediction from its own anatomy, as a Markdown
table for docs/measurements.md#on-a-lent-gpu-the-one-command. It refuses (exit 1, nothing written) a report without the
environment or copy step, one without slot anatomy rows, one without a timed row, one of the CPU emulation, and a
run name already recorded.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import gpu_validate as gv  # noqa: E402
import kernel_model as km  # noqa: E402

#: the step groups whose ``hccc run`` rows are program rows of the run
ROW_GROUPS = ("latency", "large", "hm", "examples", "pathology")


class RecordError(ValueError):
    """A report this script cannot record (the message says why)."""


def card_of(gpu: str) -> str:
    """"H100" / "H200" / ... from the driver's name ("NVIDIA H200"), else the name itself."""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", gpu or "")
    return m.group(1) if m else (gpu or "unknown")


def _step(steps: list, group: str, *, passed: bool = True) -> dict:
    """The data of the report's first ``group`` step (that passed, unless ``passed`` is False:
    a slot anatomy that stopped short keeps the rows it printed, and they are recorded)."""
    st = next((s for s in steps if s.get("group") == group and isinstance(s.get("data"), dict)
               and (s.get("status") == "ok" or not passed)), None)
    if st is None:
        raise RecordError(f"the report has no {group} step" + (" that passed" if passed else " with data"))
    return st["data"]


def _example(program: str | None) -> str | None:
    """The example name of a run's program path (``examples/<name>.rccl`` or ``.json``), or None."""
    if not program:
        return None
    p = Path(program)
    if p.parent.name == "examples" and p.suffix in (".rccl", ".json") and (ROOT / "examples" / p.name).exists():
        return p.stem
    return None


def run_record(report: dict, *, run: str, section: str, kernels: str, when: str) -> tuple[dict, list]:
    """(the run as ``load_recorded`` reads it, the rows left out with why)."""
    if report.get("backend") not in ("cuda", "hip"):
        raise RecordError(f"a report of the {report.get('backend')!r} backend: only GPU runs are recorded")
    steps = report.get("steps") or []
    env, copy, slot = _step(steps, "env"), _step(steps, "copy"), _step(steps, "slot", passed=False)
    anatomy = (slot.get("json") or {}).get("rows")
    if not anatomy:
        raise RecordError("the slot anatomy step kept no rows")
    if not copy.get("hbm_gbps"):
        raise RecordError("the device copy step measured no rate")
    rows, left, seen = [], [], set()
    for st in steps:
        if st.get("group") not in ROW_GROUPS:
            continue
        for r in gv._run_results(st.get("data")):
            name = _example(r.get("program"))
            what = f"{st['group']} {st.get('name')}: {r.get('program')} {r.get('bytes')} B {r.get('proto')}"
            if r.get("wrong") or r.get("stuck") or not isinstance(r.get("time_us"), (int, float)):
                left.append(f"{what}: " + ("stuck" if r.get("stuck") else f"{r.get('wrong')} wrong"
                                           if r.get("wrong") else "no time"))
                continue
            row = {"program": name or Path(str(r.get("program"))).stem, "bytes": int(r["bytes"]),
                   "proto": r.get("proto") or "simple", "placement": "in" if r.get("inplace") else "out",
                   "us": round(float(r["time_us"]), 1)}
            if str(r.get("slice") or "").isdigit():
                row["slice"] = int(r["slice"])
            if r.get("fuse") in ("on", "auto"):
                row["fuse"] = r["fuse"]
            if name is None:
                row["not_in_repository"] = True
            key = (row["program"], row["bytes"], row["proto"], row["placement"], row.get("slice"), row.get("fuse"))
            if key in seen:
                left.append(f"{what}: measured again (the first time kept)")
                continue
            seen.add(key)
            rows.append(row)
    if not rows:
        raise RecordError("the report has no timed row that came back right")
    return {"run": run, "section": section, "card": card_of(env.get("gpu")), "sms": int(env.get("sms") or 0),
            "kernels": kernels, "recorded": when,
            "units": {"hbm_tbs": round(float(copy["hbm_gbps"]) / 1000, 4), "anatomy": anatomy},
            "rows": rows}, left


def table(rec: list[dict], run: str) -> str:
    """The run's rows beside the model's prediction (``kernel_model.recorded``), as Markdown."""
    out = ["| program | size | proto | fuse | placement | slice | measured (us) | model (us) | verdict |",
           "|---|---:|---|---|---|---:|---:|---:|---|"]
    for r in rec:
        if r["run"] != run:
            continue
        out.append(f"| {r['program']} | {gv._size(r['bytes'])} | {r['proto']} | {r.get('fuse') or '-'} | "
                   f"{r['placement']} | {r.get('slice') or 'auto'} | {r['measured_us']:,.1f} | "
                   f"{'-' if r['predicted_us'] is None else format(r['predicted_us'], ',.1f')} | {r['verdict']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="gpu_validate.py --quick --json's file")
    ap.add_argument("--run", required=True, help="the run's name (a word: sixth, seventh, ...)")
    ap.add_argument("--section", required=True, help="the title of the section its table goes under "
                    "(docs/measurements.md#the-kernel-cost-model lists the runs)")
    ap.add_argument("--kernels", default="v5", help="the kernels' generation (default v5)")
    ap.add_argument("--dry-run", action="store_true", help="print, write nothing")
    ap.add_argument("--runs-dir", default=str(km.RECORDED_RUNS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[a-z][a-z0-9_]*", args.run):
        print(f"record_gpu_run: error: --run {args.run!r}: a lower-case word", file=sys.stderr)
        return 1
    runs_dir = Path(args.runs_dir)
    try:
        report = json.loads(Path(args.report).read_text())
        if not isinstance(report, dict):
            raise RecordError("not a gpu_validate.py --json report")
        known = km.load_recorded(km.RECORDED, runs_dir)
        if args.run in known:
            raise RecordError(f"a run named {args.run!r} is already recorded")
        when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        run, left = run_record(report, run=args.run, section=args.section, kernels=args.kernels, when=when)
    except (OSError, json.JSONDecodeError, RecordError, KeyError, TypeError, ValueError) as exc:
        print(f"record_gpu_run: error: {args.report}: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(run, indent=1) + "\n"
    target = runs_dir / f"{args.run}.json"
    if not args.dry_run:
        runs_dir.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(text)
        tmp.replace(target)
    # the model's prediction of the run from its own anatomy (read back as kernel_model reads it)
    rec = km.recorded_runs({args.run: run})
    print(f"# {args.run}: {run['card']}, {run['sms']} SMs, {len(run['rows'])} rows"
          + ("" if args.dry_run else f", written to {target}"))
    print(table(rec, args.run))
    for why in left:
        print(f"left out: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
