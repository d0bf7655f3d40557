# Set-up on a fresh machine: `make demo` (quickstart) and `make test` (whole suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: the CPU wheel on disk; a range would pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q "paddlepaddle==3.3.1"
	$(BIN)/pip install -q -e ".[dev]"
	# The real-model zoo (tests/zoo): transformers and paddleformers, tiny configs, no downloads.
	# paddleformers pulls paddlecodec, which registers itself as torchcodec and breaks transformers' Llama.
	$(BIN)/pip install -q -e ".[zoo]"
	$(BIN)/pip uninstall -y -q paddlecodec || true
	# Browser tests drive Debian's chromium; playwright's own browser download is never used.
	# Without root or apt they are skipped, and say so.
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq chromium fonts-dejavu-core >/dev/null) || echo "chromium not installed: browser tests will skip"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/quickstart.py

test: $(STAMP)
	$(BIN)/ruff check nbdiff tests benchmarks examples
	$(BIN)/ruff format --check nbdiff tests benchmarks examples
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check nbdiff tests benchmarks examples
	$(BIN)/ruff format --check nbdiff tests benchmarks examples

# mypy over the package (not part of `make test`, so a new stub release cannot break CI).
typecheck: $(STAMP)
	$(BIN)/python -m mypy nbdiff --ignore-missing-imports --follow-imports=silent

clean:
	rm -rf $(VENV) build *.egg-info
