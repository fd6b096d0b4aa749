# ingero: every target does its own set-up first (idempotent, fast when done).
VENV := .venv
PY := $(VENV)/bin/python
SCENARIO ?= cpu-contention
PYTEST_ARGS ?=

.PHONY: setup test unit live demo bench docs clean

setup:
	@bash scripts/setup.sh

# The full suite: unit tests and live eBPF tests (root).  Under CI=1 a live
# test that cannot load BPF fails instead of skipping.
test: setup
	$(PY) -m pytest -q -rs --durations=40 $(PYTEST_ARGS) tests

unit: setup
	$(PY) -m pytest -q tests/unit

live: setup
	$(PY) -m pytest -q -rs tests/live

demo: setup
	$(VENV)/bin/ingero demo $(SCENARIO)

bench: setup
	$(PY) -m bench.run

docs: setup
	$(PY) -c "from ingero.store.schema_doc import markdown; open('docs/schema.md','w').write(markdown())"

clean:
	rm -rf $(VENV) demos/build .pytest_cache
