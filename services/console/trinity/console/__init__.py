"""The console: a web UI over the gateway and buffer gRPC contracts (docs/console.md)."""
