"""Cost models: what an op costs on a device (read off the IR, the roofline model, XLA-style fusion)."""
