"""The Buffer service: task sets with leases and curricula, experience streams on Redis Streams."""
