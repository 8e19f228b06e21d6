"""The graph IR: a Graph of Ops over Values.

Ops are mutable and keep their operands' use lists up to date, so passes can ask a value who
reads it. Types and attributes are frozen (see `types.py`, `attributes.py`). A graph keeps its ops
in a list that the verifier requires to be a topological order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from pesto_ir.ir.attributes import (
    Attr,
    BoolAttr,
    BytesAttr,
    DeviceAttr,
    DictAttr,
    DtypeAttr,
    DurationAttr,
    FloatAttr,
    GraphAttr,
    IntAttr,
    ListAttr,
    NoneAttr,
    StringAttr,
    TypeAttr,
    to_attr,
)
from pesto_ir.ir.types import Type

# What `str(graph)` returns: `.pir` text, from `printer.print_graph`, which the printer sets when it
# is imported (`import pesto_ir` imports it, so it is always set); the printer builds on this module,
# not the reverse.
_graph_printer: Callable[[Graph], str] | None = None


def set_graph_printer(printer: Callable[[Graph], str]) -> None:
    """Make `str(graph)` print with `printer` (`pesto_ir.ir.printer` sets `print_graph`)."""
    global _graph_printer
    _graph_printer = printer


@dataclass(frozen=True, slots=True)
class Location:
    """A place in a source file: the user's Python line, or a line of a `.pir` file."""

    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}" if self.col else f"{self.file}:{self.line}"


class Value:
    """A result of an op, or an input of the graph (`param` when it is trainable state)."""

    __slots__ = ("name", "type", "owner", "index", "uses", "param", "pos")

    def __init__(self, name: str, type: Type, owner: Op | None = None, index: int = 0,
                 param: bool = False) -> None:
        self.name = name
        self.type = type
        self.owner = owner
        self.index = index
        self.uses: list[tuple[Op, int]] = []
        self.param = param
        self.pos: Location | None = None  # where it was defined in a .pir text, if parsed

    def users(self) -> list[Op]:
        """Distinct ops that read this value, in first-use order."""
        uses = self.uses
        if len(uses) < 2:  # the common case, without building a dict
            return [uses[0][0]] if uses else []
        return list(dict.fromkeys(map(_first, uses)))  # ops hash by identity

    def replace_all_uses_with(self, other: Value) -> None:
        for op, i in list(self.uses):
            op.set_operand(i, other)

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Op:
    """One operation: opcode, operands, typed results, attributes and a location."""

    __slots__ = ("name", "opcode", "_operands", "results", "attrs", "loc", "pos", "graph")

    def __init__(self, name: str, opcode: str, operands: Iterable[Value], result_types: Iterable[Type],
                 attrs: Mapping[str, Any] | None = None, result_names: Iterable[str] | None = None,
                 loc: Location | None = None) -> None:
        self.name = name
        self.opcode = opcode
        self._operands: list[Value] = []
        types = list(result_types)
        names = list(result_names) if result_names is not None else (
            [name] if len(types) == 1 else [f"{name}#{i}" for i in range(len(types))])
        if len(names) != len(types):
            raise ValueError(f"op {name}: {len(names)} result names for {len(types)} results")
        self.results: list[Value] = ([Value(names[0], types[0], self)] if len(types) == 1 else
                                     [Value(n, t, self, i) for i, (n, t) in enumerate(zip(names, types))])
        self.attrs: dict[str, Attr] = {k: v if isinstance(v, Attr) else to_attr(v) for k, v in (attrs or {}).items()}
        self.loc = loc
        self.pos: Location | None = None  # where it was written in a .pir text, if parsed
        self.graph: Graph | None = None
        own = self._operands
        for v in operands:  # `_append_operand`, inline: a graph's builders call this for every op
            v.uses.append((self, len(own)))
            own.append(v)

    # operands keep the use lists of the values they read
    @property
    def operands(self) -> tuple[Value, ...]:
        return tuple(self._operands)

    def _append_operand(self, v: Value) -> None:
        v.uses.append((self, len(self._operands)))
        self._operands.append(v)

    def set_operand(self, i: int, v: Value) -> None:
        old = self._operands[i]
        old.uses.remove((self, i))
        self._operands[i] = v
        v.uses.append((self, i))

    def set_operands(self, values: Iterable[Value]) -> None:
        self.drop_operands()
        for v in values:
            self._append_operand(v)

    def drop_operands(self) -> None:
        for i, v in enumerate(self._operands):
            v.uses.remove((self, i))
        self._operands = []

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"op {self.name} has {len(self.results)} results, not one")
        return self.results[0]

    # attributes
    def get(self, key: str, default: Any = None) -> Any:
        """An attribute's plain Python value, or `default`."""
        a = self.attrs.get(key)
        return default if a is None else a.value

    def set(self, key: str, value: Any) -> None:
        self.attrs[key] = to_attr(value)

    def producers(self) -> list[Op]:
        """Distinct ops whose results this op reads (graph inputs excluded)."""
        operands = self._operands
        if len(operands) == 1:  # the common case, without building a dict
            owner = operands[0].owner
            return [] if owner is None else [owner]
        return list(dict.fromkeys([v.owner for v in operands if v.owner is not None]))

    def consumers(self) -> list[Op]:
        """Distinct ops that read any result of this op, in result then first-use order."""
        results = self.results
        if len(results) == 1:
            return results[0].users()
        return list(dict.fromkeys([op for r in results for op, _ in r.uses]))

    def subgraphs(self) -> list[Graph]:
        """Nested graphs held by attributes, also inside lists and dicts (`cond` branches)."""
        out: list[Graph] = []
        for a in self.attrs.values():
            if type(a) not in LEAF_ATTRS:  # most attributes hold no graph: skip the walk
                _collect_graphs(a, out)
        return out

    def where(self) -> str:
        """Where this op is, for error messages: its .pir position and/or its source location."""
        parts = [str(p) for p in (self.pos, self.loc) if p is not None]
        return " / ".join(parts) if parts else "<no location>"

    def __repr__(self) -> str:
        return f"<Op {self.name} = {self.opcode}>"


_first = itemgetter(0)  # the op of a (op, operand index) use

# Attribute classes that hold no other attribute, so no nested graph (exactly these classes, not
# subclasses): what most attributes are, which `subgraphs` and the verifier need not look into.
LEAF_ATTRS: frozenset[type] = frozenset({IntAttr, FloatAttr, BoolAttr, NoneAttr, StringAttr, DtypeAttr, TypeAttr,
                                         DurationAttr, BytesAttr, DeviceAttr})


def _collect_graphs(a: Attr, out: list[Graph]) -> None:
    if isinstance(a, GraphAttr):
        out.append(a.graph)
    elif isinstance(a, ListAttr):
        for x in a.items:
            _collect_graphs(x, out)
    elif isinstance(a, DictAttr):
        for _, x in a.entries:
            _collect_graphs(x, out)


class Graph:
    """A function: typed inputs, ops in topological order, outputs, graph attributes."""

    def __init__(self, name: str = "main", attrs: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.ops: list[Op] = []
        self.outputs: list[Value] = []
        self.attrs: dict[str, Attr] = {k: to_attr(v) for k, v in (attrs or {}).items()}
        self._values: dict[str, Value] = {}
        self._ops_by_name: dict[str, Op] = {}
        self.pos: Location | None = None
        self.source_text: str | None = None  # the .pir text it was parsed from, for error excerpts

    # ---------------------------------------------------------------- building
    def add_input(self, name: str, type: Type, param: bool = False) -> Value:
        v = Value(self._claim_value_name(name), type, param=param)
        self.inputs.append(v)
        self._values[v.name] = v
        return v

    def add_op(self, opcode: str, operands: Iterable[Value] = (), result_types: Iterable[Type] = (),
               attrs: Mapping[str, Any] | None = None, name: str | None = None,
               result_names: Iterable[str] | None = None, loc: Location | None = None) -> Op:
        """Create an op and append it (names default to fresh ones based on the opcode)."""
        types = list(result_types)
        if result_names is None:
            base = self.fresh_name(name or opcode)
            result_names = [base] if len(types) == 1 else [self.fresh_name(f"{base}.{i}") for i in range(len(types))]
            name = name or base
        else:
            result_names = list(result_names)
            name = name or (result_names[0] if result_names else self.fresh_name(opcode))
        op = Op(name, opcode, operands, types, attrs, result_names, loc)
        self.append(op)
        return op

    def append(self, op: Op) -> Op:
        return self.insert(len(self.ops), op)

    def insert(self, index: int, op: Op) -> Op:
        ops_by_name, values = self._ops_by_name, self._values
        if op.name in ops_by_name:
            raise ValueError(f"duplicate op name {op.name!r}")
        for r in op.results:
            if r.name in values:
                raise ValueError(f"duplicate value name %{r.name}")
        self.ops.insert(index, op)
        op.graph = self
        ops_by_name[op.name] = op
        for r in op.results:
            values[r.name] = r
        return op

    def erase(self, op: Op) -> None:
        """Remove an op whose results are unused."""
        for r in op.results:
            if r.uses or any(o is r for o in self.outputs):
                raise ValueError(f"cannot erase op {op.name}: result %{r.name} is still used")
        op.drop_operands()
        self.ops.remove(op)
        del self._ops_by_name[op.name]
        for r in op.results:
            del self._values[r.name]
        op.graph = None

    def set_outputs(self, values: Iterable[Value]) -> None:
        self.outputs = list(values)

    def fresh_name(self, hint: str) -> str:
        if hint not in self._values and hint not in self._ops_by_name:
            return hint
        i = 1
        while f"{hint}.{i}" in self._values or f"{hint}.{i}" in self._ops_by_name:
            i += 1
        return f"{hint}.{i}"

    def _claim_value_name(self, name: str) -> str:
        if name in self._values:
            raise ValueError(f"duplicate value name %{name}")
        return name

    def clone(self) -> Graph:
        """A copy with new ops and values (same names; frozen attributes and types shared), so a
        pass can rewrite it and still keep the original."""
        out = Graph(self.name, self.attrs)
        out.pos, out.source_text = self.pos, self.source_text
        new: dict[int, Value] = {}
        for v in self.inputs:
            copy = out.add_input(v.name, v.type, v.param)
            copy.pos = v.pos
            new[id(v)] = copy
        for op in self.ops:
            twin = Op(op.name, op.opcode, [new[id(v)] for v in op.operands], [r.type for r in op.results], op.attrs,
                      [r.name for r in op.results], op.loc)
            twin.pos = op.pos
            out.append(twin)
            for r, c in zip(op.results, twin.results):
                c.pos = r.pos
                new[id(r)] = c
        out.set_outputs([new[id(v)] for v in self.outputs])
        return out

    # ---------------------------------------------------------------- queries
    def op(self, name: str) -> Op:
        return self._ops_by_name[name]

    def value(self, name: str) -> Value:
        return self._values[name]

    def has_op(self, name: str) -> bool:
        return name in self._ops_by_name

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def params(self) -> list[Value]:
        return [v for v in self.inputs if v.param]

    def edges(self) -> Iterator[tuple[Op, Op, Value]]:
        """Every producer -> consumer dependency, once per (value, consumer op)."""
        for op in self.ops:
            seen: set[int] = set()
            for v in op.operands:
                if v.owner is not None and id(v) not in seen:
                    seen.add(id(v))
                    yield v.owner, op, v

    def topo_order(self) -> list[Op]:
        """Ops in a topological order (Kahn, stable with respect to list order); raises on a cycle."""
        if self._in_order():
            return list(self.ops)  # what Kahn, taking the lowest ready index first, would give
        index = {id(op): i for i, op in enumerate(self.ops)}
        indeg = {id(op): len(op.producers()) for op in self.ops}
        ready = [index[id(op)] for op in self.ops if indeg[id(op)] == 0]
        heapq.heapify(ready)
        order: list[Op] = []
        while ready:
            op = self.ops[heapq.heappop(ready)]
            order.append(op)
            for c in op.consumers():
                indeg[id(c)] -= 1
                if indeg[id(c)] == 0:
                    heapq.heappush(ready, index[id(c)])
        if len(order) != len(self.ops):
            raise ValueError("graph has a cycle")
        return order

    def _in_order(self) -> bool:
        """Whether the ops are listed once each, every op reads only ops of this graph listed before
        it and is read only by ops of this graph: then the list is its own topological order."""
        index = {op: i for i, op in enumerate(self.ops)}  # ops hash by identity
        if len(index) != len(self.ops):
            return False
        for i, op in enumerate(self.ops):
            for v in op._operands:
                owner = v.owner
                if owner is not None and index.get(owner, i) >= i:
                    return False
            for r in op.results:
                for user, _ in r.uses:
                    if user not in index:
                        return False
        return True

    # ---------------------------------------------------------------- identity
    def structural_key(self) -> tuple[Any, ...]:
        """Everything that prints, as a comparable tuple (parse positions excluded)."""
        return (
            self.name,
            tuple(sorted(self.attrs.items())),
            tuple((v.name, v.type, v.param) for v in self.inputs),
            tuple(
                (op.name, op.opcode, tuple(v.name for v in op.operands),
                 tuple((r.name, r.type) for r in op.results), tuple(sorted(op.attrs.items())), op.loc)
                for op in self.ops
            ),
            tuple(v.name for v in self.outputs),
        )

    def structurally_equal(self, other: Graph) -> bool:
        return self.structural_key() == other.structural_key()

    def __str__(self) -> str:
        """The graph as `.pir` text (`printer.print_graph`)."""
        return _graph_printer(self) if _graph_printer is not None else repr(self)

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.ops)} ops>"


DONATED = "donated"  # graph attribute: names of the inputs whose buffers the caller gives up


def donated_inputs(graph: Graph) -> frozenset[str]:
    """Names of the inputs the caller donates (the `donated` graph attribute, as `jax.jit`'s
    `donate_argnums`): a device may free its copy of one once its last reader there has run, and
    an update writes the next value in its place. The verifier checks the names."""
    a = graph.attrs.get(DONATED)
    if a is None or not isinstance(a.value, tuple):
        return frozenset()
    return frozenset(x for x in a.value if isinstance(x, str))


def donate_inputs(graph: Graph, names: Iterable[str]) -> None:
    """Record `names` (inputs of `graph`) as donated, beside any already recorded."""
    known = {v.name for v in graph.inputs}
    wanted = set(names)
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"graph '{graph.name}' has no input(s) {', '.join('%' + n for n in unknown)} to donate")
    wanted |= donated_inputs(graph)
    ordered = [v.name for v in graph.inputs if v.name in wanted]
    if ordered:
        graph.attrs[DONATED] = to_attr(ordered)


def infer_state_map(graph: Graph) -> dict[int, int]:
    """Output index -> input index for new `param` values: each param, in order, takes the next
    output of its type (a training step returns new params and state in the order it takes them)."""
    out: dict[int, int] = {}
    k = 0
    for i, v in enumerate(graph.inputs):
        if not v.param:
            continue
        j = next((j for j in range(k, len(graph.outputs)) if graph.outputs[j].type == v.type), None)
        if j is not None:
            out[j] = i
            k = j + 1
    return out
