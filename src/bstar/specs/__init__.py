"""Model, GPU and precision specs."""
