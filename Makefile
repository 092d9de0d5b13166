# Two commands on a fresh machine (see README): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow setup clean
$(BIN)/ckptwatch: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(BIN)/ckptwatch

# The main job on bundled real logs: the embedded pipeline over every corpus scenario,
# written to demo.duckdb, then the incidents it stored, read back with SQL.
demo: setup
	rm -f demo.duckdb
	$(BIN)/ckptwatch run --logs examples/corpus --db demo.duckdb --once
	$(BIN)/python -c "import duckdb; duckdb.connect('demo.duckdb', read_only=True).sql(\"SELECT kind, job, step, root_cause_class, root_rank, collateral, last_good_step FROM incidents ORDER BY first_ts\").show(max_width=200)"

test: setup
	$(BIN)/ruff check ckptwatch tests benchmarks scripts
	$(BIN)/python -m pytest -q --durations=20

# what `make test` leaves out for time: more scenarios through the real broker
test-slow: setup
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) demo.duckdb .pytest_cache

# Issue 14: the soak (kill -9 of every stage, broker restarts, rotation, full disks, failing
# alert receivers; every line once, the fault-free incidents, every alert delivered), then
# the input fuzzers with many more examples than CI runs.
.PHONY: soak
soak: setup
	$(BIN)/python benchmarks/soak.py --seed 1 --rounds 20 --mode both
	CKPTWATCH_FUZZ_EXAMPLES=100000 $(BIN)/python -m pytest -q tests/test_fuzz_inputs.py tests/test_integrity_fuzz.py

# Issue 15: throughput, memory and live lag against fleet size, and their picture
# (benchmarks/scaling.png; a few minutes at the default sizes, up to 10,000 ranks).
.PHONY: scaling
scaling: setup
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/scaling.py
