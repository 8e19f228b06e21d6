"""What every layer may use: errors a user sees, units, reading input files, the GC pause, union-find."""
