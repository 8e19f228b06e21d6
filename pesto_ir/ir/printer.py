"""Print a Graph as `.pir` text; `frontends/text.py` parses it back to an equal graph.

```
graph @mlp(%x: f32[64,784], param %w: f32[784,10]) {
  %y = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[64,10]
  return %y
}
```
An op's name is its first result's name; an op whose name differs (or that has no results)
is written with a label first: `@update %w2, %b2 = sgd(...)`.
"""

from __future__ import annotations

from collections.abc import Mapping

from pesto_ir.ir.attributes import Attr, DictAttr, GraphAttr, ListAttr, format_key, format_name
from pesto_ir.ir.graph import LEAF_ATTRS, Graph, Location, Op, set_graph_printer

INDENT = "  "


def print_graph(graph: Graph, indent: str = "") -> str:
    lines: list[str] = []
    _print_graph(graph, indent, lines)
    return "\n".join(lines) + ("\n" if not indent else "")


set_graph_printer(print_graph)  # str(graph) prints with this (ir.py does not import the printer)


def _print_graph(graph: Graph, indent: str, out: list[str]) -> None:
    inputs = ", ".join(
        ("param " if v.param else "") + f"%{format_name(v.name)}: {v.type}" for v in graph.inputs
    )
    header = f"graph @{format_name(graph.name)}({inputs})"
    if graph.attrs:
        header += " attributes " + print_attr_dict(graph.attrs, indent)
    out.append(f"{indent}{header} {{")
    inner = indent + INDENT
    for op in graph.ops:
        out.append(inner + print_op(op, inner))
    if graph.outputs:
        out.append(inner + "return " + ", ".join("%" + format_name(v.name) for v in graph.outputs))
    out.append(indent + "}")


def print_op(op: Op, indent: str = INDENT) -> str:
    parts: list[str] = []
    if not op.results or op.results[0].name != op.name:
        parts.append("@" + format_name(op.name) + " ")
    if op.results:
        parts.append(", ".join("%" + format_name(r.name) for r in op.results) + " = ")
    parts.append(op.opcode + "(" + ", ".join("%" + format_name(v.name) for v in op.operands) + ")")
    if op.attrs:
        parts.append(" " + print_attr_dict(op.attrs, indent))
    if op.results:
        parts.append(" : " + ", ".join(str(r.type) for r in op.results))
    if op.loc is not None:
        parts.append(" " + print_location(op.loc))
    return "".join(parts)


def print_attr_dict(attrs: Mapping[str, Attr], indent: str) -> str:
    return "{" + ", ".join(f"{format_key(k)} = {a if type(a) in LEAF_ATTRS else print_attr(a, indent)}"
                           for k, a in attrs.items()) + "}"


def print_attr(a: Attr, indent: str) -> str:
    """Like str(a), but nested graphs (also in lists and dicts: `cond` branches) are indented to
    sit inside the op that holds them."""
    if isinstance(a, GraphAttr):
        return print_graph(a.graph, indent + INDENT).lstrip()
    if isinstance(a, ListAttr) and _holds_graph(a):
        return "[" + ", ".join(print_attr(x, indent) for x in a.items) + "]"
    if isinstance(a, DictAttr) and _holds_graph(a):
        return "{" + ", ".join(f"{format_key(k)} = {print_attr(x, indent)}" for k, x in a.entries) + "}"
    return str(a)


def _holds_graph(a: Attr) -> bool:
    if isinstance(a, GraphAttr):
        return True
    if isinstance(a, ListAttr):
        return any(_holds_graph(x) for x in a.items)
    if isinstance(a, DictAttr):
        return any(_holds_graph(x) for _, x in a.entries)
    return False


def print_location(loc: Location) -> str:
    import json

    text = f"loc({json.dumps(loc.file, ensure_ascii=False)}:{loc.line}"
    return text + (f":{loc.col})" if loc.col else ")")
