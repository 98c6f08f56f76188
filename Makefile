# Set-up and the two main jobs. Both work on a fresh machine from a clean clone:
#   make demo   - builds the environment, compiles a real small model with gears, prints what happened
#   make test   - builds the environment, runs the whole test suite
# CI (.ci/run) also runs `make test-torch2.14`: a fast subset of the suite on the second torch of the matrix.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-torch2.14 fuzz zoo zoo-vision bench check-backends env clean

env: $(STAMP)

# torch is installed first and pinned: on this CPU machine `pip install torch==2.13.0` takes the
# local CPU wheel; anything looser would pull the multi-GB CUDA build. pyproject.toml declares a range
# (the torch versions rewrite works with), which the pinned torch is inside, so pip keeps it.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m rewrite demo

# Both cores: the tests run in two worker processes (pytest-xdist), each with its own per-user cache folder.
test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n 2 --durations=15 tests

# The second torch of the matrix: torch 2.14.1 in its own environment, and on it a fast subset of the suite
# (the foundation, gears, export, cache, defaults, README examples, the vision zoo's CI subset). `pip install
# torch==2.14.1` takes the CUDA build (about 5.5 GB installed; it runs on the CPU) from the machine's local wheel
# store, with torchvision 0.29.1, the one torchvision that loads beside it (timm needs it; it is named here, not in
# pyproject, so that no extra pulls another torch); rewrite, its test extras and the vision zoo's (timm, diffusers)
# are installed beside them, and pip keeps that torch (pyproject's range holds it).
TORCH2_14_VENV ?= .venv-torch2.14
TORCH2_14_PY := $(TORCH2_14_VENV)/bin/python
TORCH2_14_STAMP := $(TORCH2_14_VENV)/.installed
# The subset, one list of pytest arguments: these files, less their tests that take over half a minute each here
# (real MiniLM weights, fresh processes, every CLI subcommand in a subprocess, two ranks); `make test` runs those.
TORCH2_14_SUBSET := tests/test_foundation.py tests/test_gears.py tests/test_declared_shapes.py \
	tests/test_export.py tests/test_cache.py tests/test_defaults.py tests/test_readme.py tests/test_zoo_vision.py \
	tests/test_lifted_floats.py \
	--deselect tests/test_gears.py::test_minilm_real_weights_every_batch_gear_matches_eager_and_pads_between \
	--deselect tests/test_export.py::test_minilm_static_and_geared_exports_match_eager_in_a_fresh_process \
	--deselect tests/test_export.py::test_two_rank_all_reduce_export_and_load \
	--deselect tests/test_cache.py::test_two_writers_then_a_hit_in_a_fresh_process \
	--deselect tests/test_cache.py::test_cache_compile_warm_start_serves_every_gear_without_dynamo \
	--deselect tests/test_cache.py::test_results_equal_eager_at_every_gear \
	--deselect tests/test_defaults.py::test_cli_subcommand_defaults \
	--deselect tests/test_readme.py::test_cli_subcommand \
	--deselect "tests/test_readme.py::test_python_block_runs[docs/testing.md:16]"

$(TORCH2_14_STAMP): pyproject.toml
	$(PYTHON) -m venv $(TORCH2_14_VENV)
	$(TORCH2_14_PY) -m pip install -q --upgrade pip
	$(TORCH2_14_PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(TORCH2_14_PY) -m pip install -q -e ".[test,zoo-vision]"
	$(TORCH2_14_PY) -c "import torch; assert torch.__version__.split('+')[0] == '2.14.1', torch.__version__"
	touch $(TORCH2_14_STAMP)

test-torch2.14: $(TORCH2_14_STAMP)
	HF_HUB_OFFLINE=1 $(TORCH2_14_PY) -m pytest -q -n 2 --durations=15 $(TORCH2_14_SUBSET)

# Thousands of random graphs: static ones through the optimizer and the backend (test_fuzz.py),
# dynamic-shape programs through torch.compile and random gears (test_fuzz_dynamic.py).
# The static-kernel differential checker draws thousands of kernel signatures here (a few hundred in CI).
fuzz: $(STAMP)
	HF_HUB_OFFLINE=1 REWRITE_FUZZ_EXAMPLES=5000 REWRITE_KERNEL_DIFF_CASES=3000 $(PY) -m pytest -q tests/test_fuzz.py tests/test_fuzz_dynamic.py tests/test_kernel_diff.py

# Every architecture of the model zoo through every mode, compared with eager; prints a table (CI runs a subset).
zoo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m tests.zoo

# The zoo's timm and diffusers families (tests/zoo/vision_archs.py): timm needs torchvision, which installs only
# beside torch 2.14.1 here, so they run in the torch 2.14 environment (CI runs a subset: tests/test_zoo_vision.py).
zoo-vision: $(TORCH2_14_STAMP)
	HF_HUB_OFFLINE=1 $(TORCH2_14_PY) -m tests.zoo --family timm,diffusers

# Equivalent-graph testing of compilers (issue 45): thousands of random graphs and the zoo's graphs, each in
# several forms extracted from the e-graph, through Inductor and rewrite, compared with eager; findings are shrunk
# to scripts under benchmarks/out/check_backends/ and the figures go to benchmarks/RESULTS.md. Hours on 2 cores;
# a smaller run: make check-backends CHECK_BACKENDS_ARGS="--static 200 --dynamic 40 --zoo bert,gpt2".
CHECK_BACKENDS_ARGS ?= --static 2000 --dynamic 300 --zoo all
check-backends: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/check_backends.py $(CHECK_BACKENDS_ARGS)

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) $(TORCH2_14_VENV) .pytest_cache .hypothesis
