"""Typed clients for the services, over the gRPC contract only (no service internals)."""

from trinity.clients.buffer import BufferClient, ReadBatch

__all__ = ["BufferClient", "ReadBatch"]
