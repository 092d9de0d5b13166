# Two commands on a fresh machine (see README): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test setup clean
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
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) demo.duckdb .pytest_cache
