"""Runtime shared by every service: logging, metrics, the gRPC server bootstrap, clients, Redis."""
