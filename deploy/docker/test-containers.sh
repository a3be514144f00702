#!/usr/bin/env bash
# `make test-containers`: a Docker engine (started here if none runs, and then stopped again), the images
# (deploy/docker/build-images.sh: layer and wheel caches reused across runs), then tests/containers.
# Prints how long each part took.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-.venv/bin/python}"
trap 'deploy/docker/engine.sh stop' EXIT
t0=$(date +%s)
deploy/docker/engine.sh start
t1=$(date +%s)
deploy/docker/build-images.sh
t2=$(date +%s)
status=0
"$PY" -m pytest -q -m containers tests/containers -p no:cacheprovider || status=$?
t3=$(date +%s)
echo "test-containers: engine $((t1 - t0)) s, images $((t2 - t1)) s, tests $((t3 - t2)) s"
exit "$status"
