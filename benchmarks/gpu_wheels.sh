#!/usr/bin/env bash
# Prepares .whl/ (git-ignored) for a lent GPU machine, whose image has no network: hccc's own wheel
# and the wheels of the dependencies that image lacks (lark, platformdirs; highspy for tree packing
# and z3-solver for the step search, both used by `hccc synth`), for its Python 3.12 on x86-64.
# benchmarks/gpu_lease.sh installs them there. Run here, where pip reaches a package index:
#     bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
mkdir .whl
python -m pip wheel -q --no-deps --no-build-isolation -w .whl .
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl lark==1.3.1 platformdirs==4.14.8 highspy==1.16.0 z3-solver==4.15.4.0
ls -l .whl
du -sh .whl
