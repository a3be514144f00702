"""The Gateway: runs, the service registry and the weight-sync groups (the control plane)."""
