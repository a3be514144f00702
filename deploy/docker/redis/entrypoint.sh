#!/bin/sh
# The official Redis image's behaviour for `redis-server` commands: all interfaces, no protected mode.
if [ "$1" = "redis-server" ]; then
    shift
    exec redis-server --bind 0.0.0.0 --protected-mode no "$@"
fi
exec "$@"
