# Two commands that work on a fresh machine with Python 3.11 and access to PyPI.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-fast lint bench bench-quick clean mutation docs

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip

$(VENV)/.demo-installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[demo]'
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.demo-installed $(VENV)/.test-fast-installed

$(VENV)/.test-fast-installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[test-fast]'
	touch $@ $(VENV)/.demo-installed

$(VENV)/.bench-installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@ $(VENV)/.test-installed $(VENV)/.demo-installed

# Azurite (the Azure Blob emulator the tests start) from npm, into node_modules/.
node_modules/.installed: package.json
	npm install --no-audit --no-fund --no-package-lock --loglevel=error
	touch $@

demo: $(VENV)/.demo-installed
	$(PY) -m retryfs demo

# The tests start what they need themselves (moto's S3 server in-process, fake-gcs-server and
# Azurite as subprocesses on loopback ports, Ray locally).
test: $(VENV)/.test-installed node_modules/.installed
	$(PY) -m ruff check retryfs tests benchmarks examples
	$(PY) -m mypy
	RETRYFS_STRICT_TEST_DEPS=1 $(PY) -m pytest -ra

# The documentation site (docs/, mkdocs.yml) on http://127.0.0.1:8000. make test builds it
# with --strict and runs its examples (tests/test_docs.py).
docs: $(VENV)/.test-fast-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

# Benchmarks, never part of `make test`: `bench` runs every section at full size (about 25
# minutes on a loaded 2-core machine), `bench-quick` the same sections on small inputs in under
# two minutes.
bench: $(VENV)/.bench-installed
	$(PY) -m benchmarks.run

bench-quick: $(VENV)/.bench-installed
	$(PY) -m benchmarks.run --quick

# For contributors: a lighter install (no Ray, torch, Lightning: their tests skip), every test
# not marked e2e or slow, and a quarter of the hypothesis examples (the `fast` profile of
# tests/conftest.py), in TEST_FAST_WORKERS pytest-xdist workers, each with its own S3 endpoint
# and emulators on free loopback ports. --dist loadfile: a test module runs whole in one worker,
# in file order, as in `make test` (module fixtures, the matrices' results file). The leftovers
# check runs once, in the controller, after every worker has finished. `make test` (CI) runs
# everything, serially, with the full count.
TEST_FAST_WORKERS ?= 2
test-fast: $(VENV)/.test-fast-installed node_modules/.installed
	$(PY) -m ruff check retryfs tests benchmarks examples
	$(PY) -m mypy
	RETRYFS_HYPOTHESIS_PROFILE=fast $(PY) -m pytest -ra -m "not e2e and not slow" \
		-n $(TEST_FAST_WORKERS) --dist loadfile

# Mutation testing (slow, not in CI): mutmut over engine, classify, policy, streams and the commit
# guard ([tool.mutmut] in pyproject.toml). mutants/ must exist before Python starts: a PYTHONPATH
# entry that is missing at start-up is cached as absent and the unmutated package is imported.
# MUTANTS limits the run to mutant names (globs), e.g. MUTANTS="'retryfs.core.policy.*' 'retryfs.datapath.commits.*'".
MUTANTS ?=
# Automatic garbage collection is off in its runs (a sitecustomize.py in mutants-site/): with it
# on, mutmut's stats run died 3 times of 3 in ContextVar.set (CPython 3.11, python/cpython#148891:
# a collection's finalizer re-enters ContextVar.set inside mutmut's trampoline).
mutation: $(VENV)/.test-installed
	rm -rf mutants mutants-site && mkdir mutants mutants-site
	echo 'import gc; gc.disable()' > mutants-site/sitecustomize.py
	PYTHONPATH=$(CURDIR)/mutants:$(CURDIR)/mutants-site nice $(VENV)/bin/mutmut run \
		--max-children 2 $(MUTANTS)
	$(VENV)/bin/mutmut export-cicd-stats && cat mutants/mutmut-cicd-stats.json && echo

lint: $(VENV)/.test-fast-installed
	$(PY) -m ruff check retryfs tests benchmarks examples
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build *.egg-info node_modules
