# ingero: every target does its own set-up first (idempotent, fast when done).
VENV := .venv
PY := $(VENV)/bin/python
SCENARIO ?= cpu-contention
PYTEST_ARGS ?=

.PHONY: setup lint test unit live demo bench docs clean

setup:
	@bash scripts/setup.sh

# The full suite: unit tests and live eBPF tests (root).  Under CI=1 a live
# test that cannot load BPF fails instead of skipping.  The unit tests judge
# stored traces and time nothing, so they share both cores (pytest-xdist; the
# replay-heavy modules on one worker, which caches their replays: the
# "replays" group).  The live tests marked `exact` count rows and time
# nothing, so they run two at a time too (a module per worker: their traced
# runs are module fixtures); the other live tests time real processes on
# those two cores, so they run one at a time, after them.
LIVE_EXACT = -m exact -n 2 --dist loadfile
LIVE_TIMED = -m "not exact"

test: setup lint
	$(PY) -m pytest -q -rs --durations=20 -n 2 --dist loadgroup $(PYTEST_ARGS) tests/unit
	$(PY) -m pytest -q -rs --durations=20 $(LIVE_EXACT) $(PYTEST_ARGS) tests/live
	$(PY) -m pytest -q -rs --durations=40 $(LIVE_TIMED) $(PYTEST_ARGS) tests/live

# ruff with the settings in pyproject.toml (120 columns; pyflakes and pycodestyle's errors)
lint: setup
	$(VENV)/bin/ruff check .

unit: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup tests/unit

live: setup
	$(PY) -m pytest -q -rs $(LIVE_EXACT) tests/live
	$(PY) -m pytest -q -rs $(LIVE_TIMED) tests/live

demo: setup
	$(VENV)/bin/ingero demo $(SCENARIO)

bench: setup
	$(PY) -m bench.run

docs: setup
	$(PY) -c "from ingero.store.schema_doc import markdown; open('docs/schema.md','w').write(markdown())"
	$(PY) -c "from ingero.commands.reference import markdown; open('docs/cli.md','w').write(markdown())"

clean:
	rm -rf $(VENV) demos/build .pytest_cache
