"""Model directories shared by the services: tiny random models for tests, GGUF import for real ones."""
