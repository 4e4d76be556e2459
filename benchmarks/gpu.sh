#!/usr/bin/env bash
# The GPU benchmarks and OpenCL tests on a lent NVIDIA machine (see "GPU runs" in
# benchmarks/README.md).
#   bash benchmarks/gpu.sh fetch   here: pyopencl and its needs as Python 3.12 wheels in .whl/,
#                                  and the commit measured (.whl/commit; the tree must be clean)
#   bash benchmarks/gpu.sh run     there (device `run`, carry [".whl"]): build easyad, point
#                                  OpenCL at NVIDIA's driver, benchmark (results/gpu.md into
#                                  $OUT), profile, run the OpenCL tests
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
fetch)
    exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
    grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
    if [ -n "$(git status --porcelain)" ]; then
        echo "gpu.sh fetch: commit first (the GPU figures must name a clean commit)" >&2; exit 1
    fi
    for spec in pyopencl==2026.1.4 pytools==2026.1.1 platformdirs==4.14.7 siphash24==1.9; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d .whl "$spec"
    done
    git rev-parse HEAD > .whl/commit
    ls .whl ;;
run)
    out=${OUT:-/tmp/out}; mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    export EASYAD_CACHE_DIR=/tmp/easyad-cache
    mkdir -p /tmp/icd && echo /usr/lib/libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
    export OCL_ICD_VENDORS=/tmp/icd
    nvidia-smi -L; lscpu | grep -m1 'Model name'; python3 --version
    start=$SECONDS
    python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
    echo "built in $((SECONDS - start)) s"
    timeout 120 python3 -m easyad devices 2>&1 | tee "$out/devices.txt" || true
    # the benchmarks (gpu.md into $OUT), then where a step's time goes, then the tests
    commit=$(cat .whl/commit 2>/dev/null || true)
    timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/run.py --only "${BENCH:-gpu}" --write \
        --output "$out" --rounds "${ROUNDS:-10}" --seconds 0.1 ${commit:+--commit $commit} \
        2>&1 | tee "$out/bench.log" | grep -v '^  round' || echo "benchmarks: exit $?"
    (cd benchmarks && timeout 90 python3 gpu_profile.py) > "$out/profile.txt" 2>&1 || true
    tests=(tests/test_tensor_record_cl.py tests/test_tensor_record_cl_vector.py
           tests/test_optim_device.py tests/test_opencl_dispatch.py tests/test_replay_cl.py
           tests/test_tensor.py tests/test_tensor_record.py tests/test_tensor_steps.py
           tests/test_engine_equivalence.py tests/test_kernel_proofs.py tests/test_devices.py
           tests/test_eager_sweep.py tests/test_layers.py tests/test_structural_core.py
           tests/test_transforms_torch.py tests/test_add_a_function.py tests/test_helpers.py)
    timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -n 12 \
        --timeout 150 --maxfail 40 "${tests[@]}" > "$out/tests.txt" 2>&1 || echo "tests: exit $?"
    tail -15 "$out/tests.txt" ;;
*)
    echo "usage: bash benchmarks/gpu.sh fetch|run" >&2; exit 2 ;;
esac
