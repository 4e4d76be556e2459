#!/usr/bin/env bash
# The GPU benchmarks on a lent NVIDIA machine (see "GPU runs" in benchmarks/README.md).
#   bash benchmarks/gpu.sh fetch   here: pyopencl and its needs as Python 3.12 wheels in .whl/
#   bash benchmarks/gpu.sh run     there (device `run`, carry [".whl"]): build easyad, point
#                                  OpenCL at NVIDIA's driver, test the tensors, benchmark
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
fetch)
    exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
    grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
    for spec in pyopencl==2026.1.4 pytools==2026.1.1 platformdirs==4.14.7 siphash24==1.9; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d .whl "$spec"
    done
    ls .whl ;;
run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    mkdir -p /tmp/icd && echo /usr/lib/libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
    export OCL_ICD_VENDORS=/tmp/icd
    python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
    python3 -c "import easyad as ad; print(ad.devices())"
    out=${OUT:-/tmp/out}; mkdir -p "$out"
    python3 -m pytest -q -p no:cacheprovider -x tests/test_tensor_record_cl.py \
        tests/test_optim_device.py 2>&1 | tail -5 | tee "$out/tests.txt"
    python3 benchmarks/run.py --only "${BENCH:-gpu}" --write --output "$out" ;;
*)
    echo "usage: bash benchmarks/gpu.sh fetch|run" >&2; exit 2 ;;
esac
