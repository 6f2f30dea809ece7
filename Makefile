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
	$(BIN)/ruff check tierd backends tests bench examples pyspark_tierd.py
	$(BIN)/ruff format --check tierd backends tests bench examples pyspark_tierd.py

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

# LocalStack's S3 in host mode (no Docker) on 127.0.0.1:4566, in its own venv (.venv-localstack)
# with a Python >= 3.12 found on the machine. The tests start their own on a free port, from
# `make test`; see localstack/README.md.
.PHONY: localstack
localstack: $(STAMP)
	$(BIN)/python -m tierd.testing.localstack --port 4566 --dir data/localstack
