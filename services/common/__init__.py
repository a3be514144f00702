"""Trinity: reinforcement fine-tuning for LLMs as gRPC microservices."""

__version__ = "0.1.0"
