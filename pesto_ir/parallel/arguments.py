"""How a call's arguments meet a compiled step: the input signature an executable is cached under,
the flat input positions of argument numbers, which outputs are the next value of which inputs
(`state_map`), and plain `jax.jit` of the function over its flat leaves or kept to one signature,
with `JitExecutable`, what runs when autotuning chose it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from pesto_ir.ir.graph import Graph
from pesto_ir.util.errors import PestoError


def plain_jit(fn: Callable[..., Any], treedef: Any, n_leaves: int, device: Any,
              donate: Sequence[int]) -> Callable[..., Any]:
    """Plain `jax.jit(fn)` on one device, as a function of the flat input leaves (of `treedef`, the
    structure of `(args, kwargs)`) returning the flat outputs."""
    import jax
    from jax.sharding import SingleDeviceSharding

    def flat(*xs: Any) -> list[Any]:
        args, kwargs = jax.tree_util.tree_unflatten(treedef, list(xs))
        return jax.tree_util.tree_leaves(fn(*args, **kwargs))

    sharding = SingleDeviceSharding(device)
    return jax.jit(flat, in_shardings=tuple(sharding for _ in range(n_leaves)), out_shardings=sharding,
                   donate_argnums=tuple(donate))


class NewSignature(Exception):
    """Raised while `guarded_jit` traces: the arguments are not of the signature it stands for."""


def guarded_jit(fn: Callable[..., Any], key: Any, device: Any, donate_argnums: Sequence[int]) -> Callable[..., Any]:
    """`jax.jit(fn)` on `device` that only ever compiles for `key` (pytree structure of `(args, {})`
    and `signatures` of its leaves); tracing for any other signature raises `NewSignature`."""
    import jax
    from jax.sharding import SingleDeviceSharding

    def guarded(*args: Any) -> Any:
        leaves, tree = jax.tree_util.tree_flatten((args, {}))
        if (tree, tuple((x.shape, x.dtype, x.aval.weak_type) for x in leaves)) != key:
            raise NewSignature
        return fn(*args)

    sharding = SingleDeviceSharding(device)
    return jax.jit(guarded, in_shardings=sharding, out_shardings=sharding, donate_argnums=tuple(donate_argnums))


class JitExecutable:
    """What runs when autotuning chose plain `jax.jit`: the jitted step on one device, called like a
    Pesto executable (flat input leaves in, flat outputs out), and described like one, so that
    `step.executable.describe()`, `.devices`, `.num_segments`, `.transfers` and `.input_devices()`
    work whichever candidate won, and say that jax.jit runs and why.

    `jitted` is `guarded_jit(fn, ...)` (called on the positional arguments, the structure `treedef`
    unflattens the leaves into; the same function object the wrapper's fast path calls, so it is
    compiled once) when `guarded`, else `plain_jit(...)` (called on the flat leaves: calls with
    keyword arguments or non-array leaves)."""

    def __init__(self, jitted: Callable[..., Any], guarded: bool, treedef: Any, device: Any, name: str,
                 n_inputs: int, verdict: str) -> None:
        self.jitted, self.guarded, self.treedef = jitted, guarded, treedef
        self.device, self.name, self.num_inputs, self.verdict = device, name, n_inputs, verdict

    def __call__(self, *leaves: Any) -> list[Any]:
        if not self.guarded:
            return list(self.jitted(*leaves))
        import jax

        args, _ = jax.tree_util.tree_unflatten(self.treedef, leaves)
        return list(jax.tree_util.tree_leaves(self.jitted(*args)))

    @property
    def devices(self) -> dict[str, Any]:
        """Plan device name -> JAX device: the one device jax.jit runs on."""
        return {self.name: self.device}

    @property
    def num_segments(self) -> int:
        return 1  # one executable for the whole step

    @property
    def transfers(self) -> list[Any]:
        return []  # nothing moves between devices

    def input_devices(self) -> list[Any]:
        return [self.device] * self.num_inputs

    def describe(self) -> str:
        return f"plain jax.jit on {self.device} ({self.name}): one executable for the whole step; {self.verdict}"


_ARRAY_SIGNATURE = attrgetter("shape", "dtype", "weak_type")


def _signature(x: Any) -> tuple[Any, ...]:
    """What a compiled entry depends on: shape, dtype and weak type (Python scalars by type)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return (type(x),)
    return (x.shape, dtype, getattr(x, "weak_type", False))


def signatures(leaves: list[Any]) -> tuple[tuple[Any, ...], ...]:
    """`_signature` of every leaf; JAX arrays (the usual case) through one C-level attrgetter."""
    try:
        return tuple(map(_ARRAY_SIGNATURE, leaves))
    except AttributeError:
        return tuple(map(_signature, leaves))


def flat_indices(args: tuple[Any, ...], argnums: Sequence[int]) -> list[int]:
    """Indices among the flattened inputs of the leaves of the positional arguments `argnums`."""
    import jax

    bad = [i for i in argnums if not 0 <= i < len(args)]
    if bad:
        raise PestoError(f"argnums {bad} out of range for {len(args)} positional argument(s)")
    out: list[int] = []
    start = 0
    for i, a in enumerate(args):
        n = len(jax.tree_util.tree_leaves(a))
        if i in argnums:
            out += range(start, start + n)
        start += n
    return out


def state_map(graph: Graph, out_tree: Any, args: tuple[Any, ...], param_argnums: Sequence[int]) -> dict[int, int]:
    """Output index -> input index: for each argument of `param_argnums`, in order, the first unclaimed
    element of the returned tuple with the same pytree structure and leaf types is its next value."""
    import jax

    tu = jax.tree_util
    n_out = len(graph.outputs)
    result = tu.tree_unflatten(out_tree, list(range(n_out)))
    elements = list(result) if isinstance(result, (tuple, list)) else [result]
    starts, start = [], 0
    for a in args:
        starts.append(start)
        start += len(tu.tree_leaves(a))
    claimed: set[int] = set()
    out: dict[int, int] = {}
    for i in param_argnums:
        # annotated: JAX's annotation of tree_structure names a PyTreeDef class mypy cannot resolve
        want: jax.tree_util.PyTreeDef = tu.tree_structure(args[i])
        for j, element in enumerate(elements):
            if j in claimed or want != tu.tree_structure(element):
                continue
            outs = tu.tree_leaves(element)
            ins = range(starts[i], starts[i] + len(outs))
            if all(graph.outputs[k].type == graph.inputs[n].type for k, n in zip(outs, ins)):
                claimed.add(j)
                out.update(zip(outs, ins))
                break
    return out
