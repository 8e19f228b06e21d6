"""Running with JAX: the reference interpreter, primitive parameters, profiling, timing, measured links and
collectives, copies between processes."""
