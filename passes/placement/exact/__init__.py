"""Exact engines: Pesto's MILP (python-mip/CBC) and its CP-SAT model, each solved in a worker process."""
