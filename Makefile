# attache: `make up` runs the whole system locally, `make test` runs every test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PORT ?= 8000

.PHONY: up install release test bench soak clean

$(VENV)/.installed: pyproject.toml setup.py app/adapters/imaging/_lanczos.c
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

# with DATABASE_URL and BROKER_URL unset: an embedded PostgreSQL under var/ and the PostgreSQL broker in it
release: install
	@ATTACHE_DEV=1 attache db where
	ATTACHE_DEV=1 honcho start -f Procfile release
	ATTACHE_DEV=1 attache dev-token

up: release
	ATTACHE_DEV=1 honcho start -f Procfile -p $(PORT) web worker scheduler

# the tests marked long (an outage waited out, a long measurement) run in make soak, to keep this under 15 minutes.
# The rest run on TEST_WORKERS processes (pytest-xdist), a file to a process, then those marked alone (they stop
# a service the others share) on their own; exit status 5 is a selection (PYTEST_ARGS) that left one run empty.
TEST_WORKERS ?= 2
test: install
	@rc=0; \
	$(PY) -m pytest -q -m "not long and not alone" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) \
	  || { s=$$?; [ $$s = 5 ] || rc=$$s; }; \
	$(PY) -m pytest -q -m "alone and not long" $(PYTEST_ARGS) || { s=$$?; [ $$s = 5 ] || rc=$$s; }; \
	exit $$rc

# every figure beside its reference, in one run (ATTACHE_BENCH_EXTRA=1: also hostile files and sweeps)
bench: install
	$(PY) -m bench

# a bounded chaos run (SOAK_UPLOADS, SOAK_SECONDS) against servers of its own; prints its figures; then the
# tests marked long
soak: install
	$(PY) -m pytest -q -s -p no:cacheprovider soak/
	$(PY) -m pytest -q -p no:cacheprovider -m long tests/

clean:
	-test -x $(VENV)/bin/attache && $(VENV)/bin/attache db stop
	rm -rf $(VENV) var .pytest_cache
