"""The IR verifier: run after parsing, after lowering and after every pass.

It collects every finding (not just the first) as a `Diagnostic` naming the op and where it is,
and raises one `VerifyError` carrying them all.
"""

from __future__ import annotations

from pesto_ir.ir.attributes import Attr, DictAttr, GraphAttr, ListAttr, StringAttr
from pesto_ir.ir.graph import DONATED, LEAF_ATTRS, Graph, Location, Op, Value
from pesto_ir.ir.shape_rules import ShapeError, infer_result_types
from pesto_ir.util.errors import Diagnostic, SourceSpan, VerifyError
from pesto_ir.util.loader import brief


def verify(graph: Graph, context: str = "") -> None:
    """Raise `VerifyError` listing every rule `graph` breaks; return None when it is well formed."""
    diags = verify_diagnostics(graph)
    if diags:
        raise VerifyError(diags, context)


def verify_diagnostics(graph: Graph) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    _check_names(graph, diags)
    _check_donated(graph, diags)
    _check_order(graph, diags)
    for op in graph.ops:
        plain = _plain_attrs(op)  # then they are well formed and hold no graph: most ops
        subs = [] if plain else op.subgraphs()
        if not plain:
            _check_attrs(op, diags)
        _check_trip_counts(op, diags)
        _check_nested(op, subs, diags)
        _check_colocate(op, diags)
        _check_types(op, diags)
        for sub in subs:
            for d in verify_diagnostics(sub):
                d.message = f"in body '{sub.name}' of op '{op.name}': {d.message}"
                diags.append(d)
    _attach_excerpts(graph, diags)
    return diags


def _attach_excerpts(graph: Graph, diags: list[Diagnostic]) -> None:
    """Point each finding about a parsed op at its line, so the user sees it with a caret."""
    if graph.source_text is None:
        return
    for d in diags:
        if d.span is not None or d.op is None or not graph.has_op(d.op):
            continue
        pos: Location | None = graph.op(d.op).pos
        if pos is not None:
            width = len(graph.op(d.op).opcode)
            d.span = SourceSpan(pos.file, pos.line, pos.col, graph.source_text, width)


def _where(graph: Graph, v: Value) -> str:
    if v.pos is not None:
        return str(v.pos)
    return str(graph.pos) if graph.pos is not None else f"graph @{graph.name}"


def _check_names(graph: Graph, diags: list[Diagnostic]) -> None:
    seen_values: dict[str, Value] = {}
    for v in graph.inputs:
        if v.name in seen_values:
            diags.append(Diagnostic(_where(graph, v), None, f"duplicate input name %{v.name}"))
        seen_values[v.name] = v
    seen_ops: set[str] = set()
    for op in graph.ops:
        name = op.name
        if name in seen_ops:
            diags.append(Diagnostic(op.where(), name, "duplicate op name"))
        seen_ops.add(name)
        for r in op.results:
            if r.name in seen_values:
                diags.append(Diagnostic(op.where(), op.name, f"redefines value %{r.name}"))
            seen_values[r.name] = r


def _check_donated(graph: Graph, diags: list[Diagnostic]) -> None:
    """The `donated` attribute, where present, lists inputs of the graph by name, each once."""
    a = graph.attrs.get(DONATED)
    if a is None:
        return
    where = str(graph.pos) if graph.pos is not None else f"graph @{graph.name}"
    names = a.value if isinstance(a, ListAttr) else None
    if names is None or not all(isinstance(n, str) for n in names):
        diags.append(Diagnostic(where, None, f"attribute '{DONATED}' must be a list of input names, "
                                             f"got {brief(str(a))}"))
        return
    inputs = {v.name for v in graph.inputs}
    seen: set[str] = set()
    for n in names:
        if n not in inputs:
            diags.append(Diagnostic(where, None, f"attribute '{DONATED}' names %{n}, which is not an input"))
        elif n in seen:
            diags.append(Diagnostic(where, None, f"attribute '{DONATED}' names %{n} twice"))
        seen.add(n)


def _check_order(graph: Graph, diags: list[Diagnostic]) -> None:
    """Every operand is defined before its use; a violation is reported as a cycle if it is one."""
    position = {op: i for i, op in enumerate(graph.ops)}  # ops and values hash by identity
    inputs = set(graph.inputs)
    late: list[tuple[Op, Value]] = []
    for i, op in enumerate(graph.ops):
        for v in op.operands:
            owner = v.owner
            if owner is None:
                if v not in inputs:
                    diags.append(Diagnostic(op.where(), op.name, f"reads %{v.name}, which is not an input of this graph"))
                continue
            defined = position.get(owner)
            if defined is None or owner.graph is not graph:
                diags.append(Diagnostic(op.where(), op.name, f"reads %{v.name}, defined outside this graph"))
            elif defined >= i:
                late.append((op, v))
    for v in graph.outputs:
        if v.owner is None and v not in inputs or v.owner is not None and v.owner not in position:
            diags.append(Diagnostic(_where(graph, v), None, f"returns %{v.name}, which is not defined in this graph"))
    if not late:
        return
    cycle = _find_cycle(graph)
    if cycle:
        path = " -> ".join(op.name for op in cycle + [cycle[0]])
        diags.append(Diagnostic(cycle[0].where(), cycle[0].name, f"is on a cycle: {path}"))
        return
    for op, v in late:
        assert v.owner is not None
        diags.append(Diagnostic(op.where(), op.name,
                                f"uses %{v.name} before its definition (by op '{v.owner.name}' at {v.owner.where()})"))


def _find_cycle(graph: Graph) -> list[Op]:
    """One dependency cycle, as a list of ops, or [] (iterative DFS, so deep graphs are fine)."""
    state: dict[int, int] = {}  # 1 = on stack, 2 = done
    for root in graph.ops:
        if id(root) in state:
            continue
        stack: list[tuple[Op, list[Op]]] = [(root, root.producers())]
        path = [root]
        state[id(root)] = 1
        while stack:
            op, todo = stack[-1]
            if not todo:
                stack.pop()
                path.pop()
                state[id(op)] = 2
                continue
            nxt = todo.pop()
            s = state.get(id(nxt))
            if s == 1:
                cyc = path[path.index(nxt):]
                return list(reversed(cyc))
            if s is None and nxt.graph is graph:
                state[id(nxt)] = 1
                path.append(nxt)
                stack.append((nxt, nxt.producers()))
    return []


def _plain_attrs(op: Op) -> bool:
    """Whether every attribute of `op` is of a class in `LEAF_ATTRS` (so well formed, holding no graph)."""
    for a in op.attrs.values():
        if type(a) not in LEAF_ATTRS:
            return False
    return True


def _check_attrs(op: Op, diags: list[Diagnostic]) -> None:
    for key, a in op.attrs.items():
        if type(a) not in LEAF_ATTRS and not _attr_ok(a):
            diags.append(Diagnostic(op.where(), op.name, f"attribute '{key}' has unknown type {type(a).__name__}"))


def _attr_ok(a: object) -> bool:
    """Whether `a` is an attribute all the way down: lists and dicts of attributes, real graphs."""
    if isinstance(a, ListAttr):
        return all(_attr_ok(i) for i in a.items)
    if isinstance(a, DictAttr):
        return all(isinstance(k, str) and _attr_ok(v) for k, v in a.entries)
    if isinstance(a, GraphAttr):
        return isinstance(a.graph, Graph)
    return isinstance(a, Attr)


MAX_TRIPS = 10 ** 9  # a loop's trip count; past it, its cost is no time a step could take


def _check_trip_counts(op: Op, diags: list[Diagnostic]) -> None:
    """A scan's `length` and any op's `trip_count` (what the cost models multiply a loop body by)
    are whole numbers from 0 to `MAX_TRIPS`: a negative one gave a negative cost and makespan."""
    attrs = op.attrs
    if "trip_count" not in attrs and "length" not in attrs:  # most ops: nothing to check
        return
    for key in ("length", "trip_count"):
        if key not in attrs or (key == "length" and op.opcode != "scan"):
            continue
        v = op.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TRIPS:
            diags.append(Diagnostic(op.where(), op.name, f"{op.opcode}: {key} must be a whole number from 0 to "
                                                         f"{MAX_TRIPS}, not {brief(repr(v))}"))


# Structured ops run nested graphs (the cost models multiply a body by its trips, docs/pir-format.md),
# which the JAX frontend writes under these attributes: a graph each, `branches` a list of graphs.
# A `scan` with `jaxpr = 5`, or a `cond` with no branches, had been costed and planned as a plain op.
STRUCTURED = ("scan", "while", "cond")
BODY_ATTRS = ("jaxpr", "cond_jaxpr", "body_jaxpr", "branches")


def _check_nested(op: Op, subgraphs: list[Graph], diags: list[Diagnostic]) -> None:
    """`subgraphs` is `op.subgraphs()`, which the caller has at hand."""
    attrs = op.attrs
    if op.opcode not in STRUCTURED and attrs.keys().isdisjoint(BODY_ATTRS):  # most ops: nothing to check
        return
    found = len(diags)
    for key in BODY_ATTRS:
        a = attrs.get(key)
        if a is None or isinstance(a, GraphAttr) or (isinstance(a, ListAttr) and a.items
                                                     and all(isinstance(b, GraphAttr) for b in a.items)):
            continue
        diags.append(Diagnostic(op.where(), op.name, f"{op.opcode}: {key} must be a graph"
                                                     f"{' or a non-empty list of graphs' if key == 'branches' else ''}"
                                                     f", not {brief(str(a))}"))
    if op.opcode in STRUCTURED and not subgraphs and len(diags) == found:
        diags.append(Diagnostic(op.where(), op.name, f"{op.opcode} holds no nested graph to run (e.g. "
                                                     f"{'branches = [graph @b0(...) {...}]' if op.opcode == 'cond' else 'jaxpr = graph @body(...) {...}'})"))


def _check_colocate(op: Op, diags: list[Diagnostic]) -> None:
    """`colocate` names a group (docs/pir-format.md): a list or a number there was planned as if it
    were a name, where the JSON reader refuses it."""
    a = op.attrs.get("colocate")
    if a is not None and not isinstance(a, StringAttr):
        diags.append(Diagnostic(op.where(), op.name, f"colocate must be a group name in quotes (colocate = \"g1\"), "
                                                     f"not {brief(str(a))}"))


def _check_types(op: Op, diags: list[Diagnostic]) -> None:
    try:
        expected = infer_result_types(op)
    except ShapeError as e:
        diags.append(Diagnostic(op.where(), op.name, f"{op.opcode}: {e}"))
        return
    except (TypeError, ValueError, KeyError, IndexError) as e:  # a rule met what it does not expect
        what = ("an axis or index in its attributes is out of range" if isinstance(e, IndexError)
                else "its attributes have the wrong type or form")
        attrs = ", ".join(f"{k} = {brief(str(v))}" for k, v in op.attrs.items() if k not in _COST_KEYS)
        diags.append(Diagnostic(op.where(), op.name, f"{op.opcode}: {what} for operands of types {_types(op)} "
                                                     f"({attrs or 'no attributes'})"))
        return
    if expected is None:
        return
    actual = [r.type for r in op.results]
    if len(expected) != len(actual):
        diags.append(Diagnostic(op.where(), op.name, f"{op.opcode} has {len(expected)} result(s), not {len(actual)}"))
        return
    for r, want in zip(op.results, expected):
        if r.type != want:
            diags.append(Diagnostic(op.where(), op.name, f"result %{r.name} is {r.type} but {op.opcode} gives {want}"))


_COST_KEYS = ("cost", "flops", "bytes_accessed", "fusion", "group", "device", "start", "end", "memory")


def _types(op: Op) -> str:
    return ", ".join(str(v.type) for v in op.operands) or "(none)"
