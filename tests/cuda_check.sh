#!/usr/bin/env bash
# The GPU check in one go, for a machine with a GPU (CI has none), sized for one 15-minute device lease:
#   1. the CUDA tests of every test file (tests/test_cuda.py and the tests named *cuda* elsewhere);
#   2. benchmarks/gpu.py: BERT-base and a Llama-style 8x1024 decoder against eager and Inductor's best settings,
#      gears [1, 4, 16] against Inductor per size and dynamic=True, static-cache decode (its sections, --only);
#   3. optionally the model zoo on the GPU (ZOO_ARGS="--only llama,bert,..."; off unless ZOO_ARGS is set).
# Each step has its own time limit, so a slow one cannot hide the rest; logs and tables go to LOG_DIR.
#
#   bash tests/cuda_check.sh [LOG_DIR]     # LOG_DIR/cuda_tests.log, gpu_results.md, gpu_bench.log, cuda_zoo.log
#
# Environment: STEPS (default tests,bench: which of the first two steps run), PYTHON (default python3),
# TEST_LIMIT_S (default 200), TEST_WORKERS (default 4: pytest-xdist workers, where it is installed), BENCH_LIMIT_S
# (default 330),
# BENCH_ONLY (default static,gears; "decode" is the third section), BENCH_ARGS (e.g. --quick), ZOO_LIMIT_S
# (default 300), ZOO_MODES (default default,reduce-overhead), ZOO_ARGS (unset: no zoo).
#
# On the lent machines (torch 2.11, Python 3.12, no egglog): the device notes say how wheels travel. In the repo
# root here: `echo /.whl/ >> .git/info/exclude`, then download egglog 13.2 and what `import egglog` needs that
# the image lacks (black, graphviz, opentelemetry-api, platformdirs, pytokens; seen 2026-11-27) for cp312:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl egglog==13.2.0 black graphviz opentelemetry-api platformdirs pytokens
# and run, with carry [".whl"]:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && bash tests/cuda_check.sh $OUT
set -u
cd "$(dirname "$0")/.."
LOG_DIR=${1:-.}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$LOG_DIR"
"$PY" -c "import torch, egglog; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())" || exit 1

STEPS=${STEPS:-tests,bench}
tests_rc=0
if [[ ",$STEPS," == *",tests,"* ]]; then
    # test_cuda.py and test_gpu_policy.py are all about the GPU path; elsewhere CUDA tests carry 'cuda' in their names.
    # Several workers share the one GPU: most of these tests' time is Inductor compiling on the CPU (the first
    # lease ran 21 of test_cuda.py's 22 tests in 120 s on one worker).
    workers=()
    "$PY" -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-4}")
    timeout "${TEST_LIMIT_S:-200}" "$PY" -m pytest -q -p no:cacheprovider --continue-on-collection-errors -rfEs \
        ${workers[@]+"${workers[@]}"} tests/test_cuda.py tests/test_gpu_policy.py 2>&1 | tee "$LOG_DIR/cuda_tests.log"
    tests_rc=${PIPESTATUS[0]}
    timeout 60 "$PY" -m pytest -q -p no:cacheprovider -rfEs tests/test_streams.py tests/test_reduce_overhead.py \
        tests/test_export.py tests/test_security.py -k cuda 2>&1 | tee -a "$LOG_DIR/cuda_tests.log"
    [ "${PIPESTATUS[0]}" = 0 ] || tests_rc=1
fi

bench_rc=0
if [[ ",$STEPS," == *",bench,"* ]]; then
    # shellcheck disable=SC2086 # BENCH_ARGS is split on purpose
    timeout "${BENCH_LIMIT_S:-330}" "$PY" benchmarks/gpu.py --out "$LOG_DIR" --only "${BENCH_ONLY:-static,gears}" \
        ${BENCH_ARGS:-} 2>&1 | tee "$LOG_DIR/gpu_bench.log"
    bench_rc=${PIPESTATUS[0]}
fi

zoo_rc=0
if [ -n "${ZOO_ARGS:-}" ]; then
    # shellcheck disable=SC2086 # ZOO_ARGS is split on purpose
    timeout "${ZOO_LIMIT_S:-300}" "$PY" -m tests.zoo --device cuda --modes "${ZOO_MODES:-default,reduce-overhead}" \
        ${ZOO_ARGS} 2>&1 | tee "$LOG_DIR/cuda_zoo.log"
    zoo_rc=${PIPESTATUS[0]}
fi

echo "cuda tests rc=$tests_rc, gpu benchmark rc=$bench_rc, cuda zoo rc=$zoo_rc (124: ran past its limit)"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ] && [ "$zoo_rc" = 0 ]
