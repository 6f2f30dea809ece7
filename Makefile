# tierd — two commands: `make run` and `make test`. Everything else is set up on demand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck pytest bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever the dependency list changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Start the service on the embedded default profile (hot store under ./data/hot).
run: $(STAMP)
	$(BIN)/tierd --config conf/local.toml serve

lint: $(STAMP)
	$(BIN)/ruff check tierd backends tests bench examples
	$(BIN)/ruff format --check tierd backends tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# The whole gate: lint, strict typing, every test.
test: lint typecheck pytest

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b" >&2; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
