"""Typed clients for the services, over the gRPC contract only (no service internals)."""

from trinity.clients.buffer import BufferClient, ReadBatch
from trinity.clients.gateway import GatewayClient

__all__ = ["BufferClient", "GatewayClient", "ReadBatch"]
