"""Frontends: `.pir` text (`text`), cost-graph JSON (`json_graph`), JAX functions (`jax`)."""
