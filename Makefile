# Two commands do all the set-up: `make run` and `make test`. Each installs what is missing on first use
# (Debian packages with Chromium for the browser tests, the virtual environment, pycaffe built from source and
# cached, the bundled Caffe's `caffe` binary built and cached, Python dependencies, the pages' npm libraries copied
# into static/vendor/), then serves the app or runs every test. A second run finds everything in place and starts
# at once. With CAFFE_CUDA=1 (the default where an NVIDIA driver is found) they also build the bundled Caffe with
# CUDA and cuDNN, binary and pycaffe (scripts/build-caffe.sh; docs/pycaffe.md).

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 5000
DATA   ?= var
# The bundled Caffe's CUDA build: on by itself where an NVIDIA driver is loaded or nvidia-smi answers. Exported, so
# that the tests know the CUDA root must be there (tests/test_caffe_roots.py).
CAFFE_CUDA ?= $(shell { test -e /proc/driver/nvidia/version || timeout 20 nvidia-smi -L >/dev/null 2>&1; } \
                && echo 1 || echo 0)
export CAFFE_CUDA
CAFFE_INPUTS   := scripts/build-caffe.sh $(wildcard scripts/caffe-patches/*.patch scripts/caffe-patches/cuda/*.patch)
# What the installed environment depends on: when one of these changes, `make` installs again.
INSTALL_INPUTS := setup.py constraints/ray.txt scripts/system-deps.sh scripts/build-pycaffe.sh $(CAFFE_INPUTS) Makefile
# The browser libraries: scripts/frontend.sh runs `npm ci` and copies them into static/vendor/ (ignored by git).
VENDOR_STAMP   := static/vendor/.stamp

.PHONY: run test install caffe-cuda lint clean
.DEFAULT_GOAL := test

run: install
	$(VENV)/bin/digits-memplugin serve --host $(HOST) --port $(PORT) --data-dir $(DATA)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

install: $(VENV)/.installed $(VENDOR_STAMP) $(if $(filter 1,$(CAFFE_CUDA)),caffe-cuda)

$(VENV)/.installed: $(INSTALL_INPUTS)
	scripts/system-deps.sh --browser
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel "setuptools>=68" "numpy>=1.24,<2" "protobuf>=3.20,<3.21"
	scripts/build-pycaffe.sh $(PY)
	scripts/build-caffe.sh $(PY) cpu
	$(PY) -m pip install --quiet -e ".[test]" -c constraints/ray.txt
	touch $@

# The CUDA + cuDNN Caffe root, checked at every run: the script returns in about a second when the root of its build
# key (which covers CAFFE_CUDA_ARCH) is installed, and builds or re-installs it otherwise.
caffe-cuda: $(VENV)/.installed
	scripts/build-caffe.sh $(PY) cuda

$(VENDOR_STAMP): package.json package-lock.json scripts/frontend.sh
	scripts/frontend.sh

# ruff (the rule set in pyproject.toml) and mypy over the package; `make test` runs both too (tests/test_lint.py).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy digits_memplugin

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache node_modules static/vendor
