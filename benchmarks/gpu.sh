#!/usr/bin/env bash
# The GPU benchmarks and OpenCL tests on a lent NVIDIA machine (see "GPU runs" in
# benchmarks/README.md).
#   bash benchmarks/gpu.sh fetch   here: pyopencl, dask and their needs as Python 3.12 wheels in .whl/,
#                                  and the commit measured (.whl/commit; the tree must be clean)
#   bash benchmarks/gpu.sh run     there (device `run`, carry [".whl"]): build easyad, point
#                                  OpenCL at NVIDIA's driver, benchmark (results/gpu.md into
#                                  $OUT), profile, dask's scaling, run the OpenCL tests
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
fetch)
    exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
    grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
    if [ -n "$(git status --porcelain)" ]; then
        echo "gpu.sh fetch: commit first (the GPU figures must name a clean commit)" >&2; exit 1
    fi
    for spec in pyopencl==2026.1.4 pytools==2026.1.1 platformdirs==4.14.7 siphash24==1.9 \
            dask==2026.8.0 distributed==2026.8.0 tornado==6.6.1 zict==3.0.0 tblib==3.2.2 \
            partd==1.4.2 locket==1.0.0; do
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
    # the GEMM microbenchmark first: a kernel that computes wrong numbers on this driver
    # sends the benchmarks to the old one (their first-loss check would stop them)
    if [ -f benchmarks/gpu_gemm.py ]; then
        timeout "${GEMM_TIMEOUT:-90}" python3 benchmarks/gpu_gemm.py > "$out/gemm.txt" 2>&1 || echo "gemm: exit $?"
        cat "$out/gemm.txt"
        if grep -q "WRONG RESULT" "$out/gemm.txt"; then export EASYAD_OPENCL_GEMM=tiled; fi
        # the fastest 128x128 variant on this GPU (gpu_gemm's last verdict) for the rest
        big=$(sed -n 's/^GEMM_BIG=//p' "$out/gemm.txt" | tail -1)
        if [ -n "$big" ] && [ -z "${EASYAD_OPENCL_GEMM_BIG:-}" ]; then
            export EASYAD_OPENCL_GEMM_BIG=$big; echo "EASYAD_OPENCL_GEMM_BIG=$big"
        fi
    fi
    # the benchmarks (gpu.md into $OUT), then where a step's time goes, then the tests
    commit=$(cat .whl/commit 2>/dev/null || true)
    timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/run.py --only "${BENCH:-gpu}" --write \
        --output "$out" --rounds "${ROUNDS:-10}" --seconds 0.1 ${commit:+--commit $commit} \
        2>&1 | tee "$out/bench.log" | grep -v '^  round' || echo "benchmarks: exit $?"
    if [ "${PROFILE:-1}" = 1 ]; then
        (cd benchmarks && timeout 90 python3 gpu_profile.py) > "$out/profile.txt" 2>&1 || true
    fi
    # conv2d by both OpenCL routes (im2col + GEMM, a kernel per op): where each wins here
    if [ "${CONV:-1}" = 1 ]; then
        timeout "${CONV_TIMEOUT:-60}" python3 benchmarks/conv_opencl.py --rounds 5 \
            > "$out/conv.txt" 2>&1 || echo "conv: exit $?"
        cat "$out/conv.txt"
    fi
    # dask's scaling on this machine's cores (issue 29; dask's wheels in .whl/ too:
    # `gpu.sh fetch` takes them): each process T threads, so 2 workers have cores of their own
    if [ "${DASK:-1}" = 1 ] && python3 -c "import distributed" 2>/dev/null; then
        threads=$(( $(nproc) / 2 ))
        timeout "${DASK_TIMEOUT:-150}" python3 benchmarks/dask_scaling.py --threads "$threads" \
            --write "$out/dask.md" > "$out/dask.txt" 2>&1 || echo "dask: exit $?"
        tail -12 "$out/dask.txt"
    fi
    # every test file that runs on an OpenCL device, over 12 workers (pytest-xdist is there)
    tests=$(grep -l -i -E "opencl|_cl\b|device" tests/test_*.py | tr '\n' ' ')
    # SIGINT at the limit: pytest stops and still writes its summary and the junit report;
    # the limit is cut to what RUN_LIMIT (the device call's seconds) leaves, less 20 s
    limit=${TEST_TIMEOUT:-240}
    left=$(( ${RUN_LIMIT:-100000} - SECONDS - 20 ))
    if [ "$left" -lt "$limit" ]; then limit=$(( left > 10 ? left : 10 )); fi
    echo "tests: ${limit} s"
    timeout -s INT "$limit" python3 -m pytest -p no:cacheprovider -n "${WORKERS:-12}" --timeout 150 \
        --junitxml "$out/junit.xml" -rfE $tests > "$out/tests.txt" 2>&1 \
        || echo "tests: exit $?"
    tail -25 "$out/tests.txt" ;;
*)
    echo "usage: bash benchmarks/gpu.sh fetch|run" >&2; exit 2 ;;
esac
