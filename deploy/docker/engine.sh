#!/usr/bin/env bash
# A Docker engine for the container tests:
#   deploy/docker/engine.sh start   # installs docker.io / docker-compose if missing, starts dockerd if none answers
#   deploy/docker/engine.sh stop    # stops the dockerd that `start` started, and nothing else
set -euo pipefail
PIDFILE="${TRINITY_DOCKERD_PIDFILE:-/tmp/trinity-dockerd.pid}"
case "${1:-}" in
start)
    if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose >/dev/null
    fi
    if docker info >/dev/null 2>&1; then
        echo "docker engine: already running"
        exit 0
    fi
    dockerd >/tmp/trinity-dockerd.log 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && { echo "docker engine: started (pid $(cat "$PIDFILE"))"; exit 0; }
        sleep 1
    done
    echo "docker engine did not answer within 60 s; its log ends with:" >&2
    tail -20 /tmp/trinity-dockerd.log >&2
    exit 1
    ;;
stop)
    [ -f "$PIDFILE" ] || exit 0
    pid="$(cat "$PIDFILE")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    rm -f "$PIDFILE"
    echo "docker engine: stopped (pid $pid)"
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
