"""`pesto_ir.parallelize(fn, devices=...)`: a jit-like wrapper that runs `fn` split across devices as
planned (`wrapper`), and the choice among candidate executables by measuring them (`autotune`)."""

from pesto_ir.parallel.wrapper import parallelize

__all__ = ["parallelize"]
