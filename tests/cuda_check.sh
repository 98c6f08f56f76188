#!/usr/bin/env bash
# The CUDA checks in one go, for a machine with a GPU (CI has none): the CUDA tests of every test file,
# then the model zoo on the GPU (default and reduce-overhead, every architecture, compared with eager
# on the GPU). Each step has its own time limit so a slow one cannot hide the rest.
#
#   bash tests/cuda_check.sh [LOG_DIR]        # logs: LOG_DIR/cuda_tests.log, LOG_DIR/cuda_zoo.log
#
# Environment: PYTHON (default python3), TEST_LIMIT_S (default 240), ZOO_LIMIT_S (default 900),
# ZOO_MODES (default default,reduce-overhead), ZOO_ARGS (more arguments for the zoo, e.g. "--only bart,t5").
# Seen on an H200 (torch 2.11): the tests take about 150 s; the zoo about 7 s an architecture for the two
# modes, so the 86 architectures need about 10 minutes (split them with ZOO_ARGS="--only ..." to fit a limit).
set -u
cd "$(dirname "$0")/.."
LOG_DIR=${1:-.}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$LOG_DIR"
"$PY" -c "import torch, egglog; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())" || exit 1

# test_cuda.py is all CUDA; elsewhere the CUDA tests carry 'cuda' in their names.
timeout "${TEST_LIMIT_S:-240}" "$PY" -m pytest -q -p no:cacheprovider --continue-on-collection-errors \
    -rfEs tests/test_cuda.py tests/test_streams.py tests/test_reduce_overhead.py tests/test_export.py \
    tests/test_security.py -k cuda 2>&1 | tee "$LOG_DIR/cuda_tests.log"
tests_rc=${PIPESTATUS[0]}

# shellcheck disable=SC2086 # ZOO_ARGS is split on purpose
timeout "${ZOO_LIMIT_S:-900}" "$PY" -m tests.zoo --device cuda --modes "${ZOO_MODES:-default,reduce-overhead}" \
    ${ZOO_ARGS:-} 2>&1 | tee "$LOG_DIR/cuda_zoo.log"
zoo_rc=${PIPESTATUS[0]}

echo "cuda tests rc=$tests_rc, cuda zoo rc=$zoo_rc (124: ran past its limit)"
[ "$tests_rc" = 0 ] && [ "$zoo_rc" = 0 ]
