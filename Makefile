# One entry point per job. Every target goes through `install`, which only installs what is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# A CPU build of torch unless the user asks for another (TORCH_SPEC="torch==2.13.0+cu126" ...).
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-all test-torch lint rules-check fuzz bench bench-gpu sweep golden clean

# Bytecode of our packages, written as installing a wheel writes it: an editable install ships
# none, and with PYTHONDONTWRITEBYTECODE=1 (set in some sandboxes and containers) every command
# compiled ~50 modules again (0.1-0.3 s of a one-second replan). compileall writes the .pyc
# files whatever that variable says; stale ones are rebuilt by the next `make install`, and
# Python ignores a stale one anyway (it checks the source's mtime). __pycache__ is git-ignored.
BYTECODE_DIRS := hapc synth costmodel profiler

install: $(STAMP)
	$(PY) -m compileall -q $(BYTECODE_DIRS)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[test]"
	touch $(STAMP)

# Compile the example GPT for the small mixed cluster; run what exists of the pipeline.
demo: install
	$(PY) -m hapc.demo

# The default test run: fast tests (slow ones are marked and run by test-all / CI).
test: install
	$(PY) -m pytest -q

test-all: install
	$(PY) -m pytest -q -m ""

# The tracer, rule-checker, executor and emitted-program tests against another torch, in a venv
# of its own (.venv-torch-<version>, kept between runs; the main .venv is not touched):
#   make test-torch TORCH_SPEC=torch==2.14.1      (TEST_TORCH_SLOW=0 skips the torchrun tests)
test-torch:
	scripts/test_torch.sh "$(TORCH_SPEC)"

lint: install
	$(VENV)/bin/ruff check .

rules-check: install
	$(PY) -m hapc.rules check

# Property-based fuzzing of the whole chain and of every rule (tests/fuzz), longer than CI's slow
# pass and from a fresh seed each time (printed; FUZZ_SEED=N repeats a run). Failing cases print
# as literals to paste into tests/fuzz/test_fuzz_regressions.py. FUZZ_PENDING=1 adds the patterns
# whose fixes are pending (in-place writes into fresh tensors, frozen parameters).
FUZZ_CASES      ?= 2000
FUZZ_RULE_CASES ?= 50000
fuzz: install
	@seed=$${FUZZ_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; echo "fuzz seed $$seed"; \
	FUZZ_SEED=$$seed FUZZ_CASES=$(FUZZ_CASES) FUZZ_RULE_CASES=$(FUZZ_RULE_CASES) \
	$(PY) -m pytest -q -m slow tests/fuzz -k "not torchrun" --hypothesis-show-statistics

# Synthesis time, plan quality per cluster, compile time, emitted DP vs DDP, cost-model accuracy:
# writes bench/results.json and BENCHMARKS.md (not part of `make test`; about 10 minutes).
bench: install
	$(PY) -m bench.run

# One short run on one GPU (budget: under 6 minutes on an H200): profile the GPU, then plan, run
# and time each benchmark config in fp32 and bf16 against the plain eager model; fills the GPU
# section of BENCHMARKS.md. `python -m bench.gpu --device cpu --quick` tests its logic on CPU.
bench-gpu: install
	$(PY) -m bench.gpu

# Refresh the golden plans that tests/plan/test_golden.py checks with `hapc check`; prints what changed.
# Compile every family of bench/zoo.py (mixtures of experts, state space, masked autoencoders,
# drop paths, contrastive, seq2seq) for 3 uneven CPU ranks and run each with --verify (~8 minutes).
sweep: install
	$(PY) -m bench.family_sweep

golden: install
	$(PY) -m bench.golden

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
