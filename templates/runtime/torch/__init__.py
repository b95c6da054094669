"""PyTorch helpers every torch build carries unchanged: framework code no spec changes (the spec's decisions come in as arguments)."""
