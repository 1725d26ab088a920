# Two commands do all the set-up: `make run` and `make test`. Each installs what is missing on first use
# (Debian packages with Chromium for the browser tests, the virtual environment, pycaffe built from source and
# cached, Python dependencies, the pages' npm libraries copied into static/vendor/), then serves the app or runs
# every test. A second run finds everything in place and starts at once.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 5000
DATA   ?= var
# What the installed environment depends on: when one of these changes, `make` installs again.
INSTALL_INPUTS := setup.py constraints/ray.txt scripts/system-deps.sh scripts/build-pycaffe.sh Makefile
# The browser libraries: scripts/frontend.sh runs `npm ci` and copies them into static/vendor/ (ignored by git).
VENDOR_STAMP   := static/vendor/.stamp

.PHONY: run test install lint clean
.DEFAULT_GOAL := test

run: install
	$(VENV)/bin/digits-memplugin serve --host $(HOST) --port $(PORT) --data-dir $(DATA)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

install: $(VENV)/.installed $(VENDOR_STAMP)

$(VENV)/.installed: $(INSTALL_INPUTS)
	scripts/system-deps.sh --browser
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel "setuptools>=68" "numpy>=1.24,<2" "protobuf>=3.20,<3.21"
	scripts/build-pycaffe.sh $(PY)
	$(PY) -m pip install --quiet -e ".[test]" -c constraints/ray.txt
	touch $@

$(VENDOR_STAMP): package.json package-lock.json scripts/frontend.sh
	scripts/frontend.sh

# ruff (the rule set in pyproject.toml) and mypy over the package; `make test` runs both too (tests/test_lint.py).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy digits_memplugin

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache node_modules static/vendor
