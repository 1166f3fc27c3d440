#!/usr/bin/env bash
# The one prepared command of a lent GPU machine (one NVIDIA H100 / H200, no network), from the
# repository's root, with .whl/ carried (benchmarks/gpu_wheels.sh makes it):
#     bash benchmarks/gpu_lease.sh
# Each step has its own timeout, and what each prints is kept under $OUT (default ./gpu_out):
# 1. install the carried wheels into /tmp/site (hccc itself among them);
# 2. the GPU tests (pytest -m gpu on the CUDA runtime and communicator tests);
# 3. benchmarks/gpu_validate.py --quick (its own budget: HCCC_GPU_BUDGET seconds, default 330),
#    report in $OUT/gpu_validate.md and $OUT/gpu_validate.json.
# Then record the run for the kernel cost model (benchmarks/recorded/runs/<run>.json) and print its
# table for docs/measurements.md#the-kernel-cost-model:
#     python benchmarks/record_gpu_run.py gpu_out/gpu_validate.json --run sixth --section "The sixth GPU run"
set -u
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
step() {   # step NAME SECONDS COMMAND...: run with a timeout, log to $OUT/NAME.log, say how it ended
    local name=$1 secs=$2
    shift 2
    local t0=$SECONDS
    timeout --kill-after=10 "$secs" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc$([ $rc -eq 124 ] && echo ' (timeout)') in $((SECONDS - t0)) s" | tee -a "$OUT/steps.log"
    tail -n 15 "$OUT/$name.log"
    return $rc
}
step install 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
step env 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvcc --version | tail -1;
    python3 -c "import hccc, torch; print(\"hccc\", hccc.__version__, \"torch\", torch.__version__, torch.cuda.get_device_name(0))"'
step tests 150 python3 -m pytest -q -p no:cacheprovider -x -m gpu tests/test_runtime_cuda.py \
    tests/test_communicator_gpu.py
step validate $(( ${HCCC_GPU_BUDGET:-330} + 60 )) python3 benchmarks/gpu_validate.py --quick \
    --budget "${HCCC_GPU_BUDGET:-330}" --report "$OUT/gpu_validate.md" --json "$OUT/gpu_validate.json" \
    --workdir /tmp/hccc-gpu-validate
cat "$OUT/steps.log"
