"""Experience streams on Redis Streams: at-least-once delivery through consumer groups."""
