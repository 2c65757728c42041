# The two commands of the README. Both create .venv when missing and install
# the project into it, so a fresh clone needs only Python 3.11+ (and Java for
# the Spark pipeline).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint test-unit install browser redis bench-peers clean bench bench-quick bench-scale soak

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The official OJS Python SDK, for the tests that drive seamq's job server through it (not on a
# registry this machine reaches: installed from ../shared beside the clone, as CI has it).
OJS_PYTHON_SDK ?= ../shared/ojs-sdks/python

$(STAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet '$(OJS_PYTHON_SDK)' 'cryptography>=42'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/seamq dev

# The suite on TEST_WORKERS pytest-xdist workers: most tests wait on services far more than they
# compute, so even 2 cores run several at once (tests/conftest.py keeps the ones that share a costly
# service together). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 4
test: lint browser bench-peers
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

# Mistakes ruff and mypy find without running anything (pyproject.toml, [tool.ruff] and [tool.mypy]:
# which rules and which modules, and why those).
lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

# The unit tier only: pure logic on in-memory fakes, in seconds (tests/unit/).
test-unit: $(STAMP)
	$(BIN)/pytest -m unit --durations=5

# Headless Chromium and its driver, for the browser tests (the admin UI, the console): Debian's
# packages, installed when missing (as root; otherwise say what to install).
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" != 0 ]; then echo "error: the browser tests need Debian's chromium and chromium-driver: sudo apt-get install chromium chromium-driver" >&2; exit 2; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }; \
	fi

# Debian's redis-server, for the Redis job queues (saq, arq) bench/peers_jobs.py measures seamq against.
redis:
	@if ! command -v redis-server >/dev/null; then \
	  if [ "$$(id -u)" != 0 ]; then echo "note: the saq and arq peers need Debian's redis-server (sudo apt-get install redis-server)" >&2; exit 0; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q redis-server >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }; \
	fi

# Oban for Python needs Python >= 3.12: a venv of its own, from the first such Python that runs (on PATH,
# or one pyenv installed without putting it on PATH).
OBAN_PYTHON ?= $(shell for p in python3.13 python3.12 $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3; do \
  "$$p" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { echo "$$p"; break; }; done)
bench-peers: $(STAMP) redis
	@if [ -n "$(OBAN_PYTHON)" ] && [ ! -x .venv-oban/bin/python ]; then \
	  $(OBAN_PYTHON) -m venv .venv-oban && .venv-oban/bin/pip install --quiet 'oban==0.6.*' || \
	  { rm -rf .venv-oban; echo "note: Oban for Python could not be installed; the bench reports it as not run" >&2; }; \
	fi

clean:
	rm -rf $(VENV) .venv-oban .seamq .pytest_cache

bench: bench-peers
	$(BIN)/python -m bench.run

bench-quick: $(STAMP) redis
	$(BIN)/python -m bench.run --quick

# Tables at scale (issue 45): retention of a day of 10 million rows, and 50 million rows of history in each
# table on both layouts; about 45 minutes.
bench-scale: $(STAMP)
	$(BIN)/python -m bench.run --only retention,scale

# Faults on one machine (workers, nats-server and PostgreSQL killed), then the network partitions of
# tests/cluster/messaging/test_network_partitions.py three times over (root only: it refuses to pass without namespaces).
soak: $(STAMP)
	$(BIN)/python -m bench.soak
	SEAMQ_LAB_ROUNDS=3 $(BIN)/pytest -p no:cacheprovider -s tests/cluster/messaging/test_network_partitions.py
