#!/usr/bin/env bash
# Build the local stand-in for python:3.11-slim-bookworm where no container registry is reachable:
# Debian bookworm by debootstrap (from the host's Debian mirror), Python 3.11 with venv, imported as an image.
#
#   deploy/docker/base-image.sh [TAG]        # default local/python:3.11-bookworm; reused when present
#
# Then build with  --build-arg PYTHON_IMAGE=local/python:3.11-bookworm
set -euo pipefail
TAG="${1:-local/python:3.11-bookworm}"
if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "base image $TAG: present"
    exit 0
fi
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
# The mirror the host's apt uses (deb822 or one-line sources), so the image sees the same packages.
MIRROR="$(grep -hoE '^URIs: *\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)"
[ -n "$MIRROR" ] || MIRROR="$(grep -hoE '^deb \S+' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -1 || true)"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
ROOTFS="$(mktemp -d)"
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase --include=python3.11,python3-venv,python3-pip,ca-certificates \
    bookworm "$ROOTFS" "$MIRROR" >/dev/null
# What the official image offers and the Dockerfiles expect: `python` on PATH, a clean apt cache.
ln -sf /usr/bin/python3 "$ROOTFS/usr/local/bin/python"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | docker import --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - "$TAG" >/dev/null
echo "base image $TAG: built ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
