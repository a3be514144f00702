"""The trackers sink: every run's events, followed through the gateway, written to TensorBoard, MLflow and W&B."""
