"""Import (and export) `pesto-graph/1` cost graphs: what other profilers write.

Each node becomes an `opaque` op carrying `cost`, `memory`, `colocate`, `backward`, `per_sample`,
`param_bytes` and its original `name` as `label`.

Memory: a node's `memory` is held for the whole step (its resident bytes), as profilers that fill it
with a node's output size expect; such a node's output is inside it, so its op gets `activation = 0`.
A node may instead split it into `resident` bytes (whole step) and `activation` bytes (its output,
held from its start until its readers are done). A node that declares none of these holds its edge
tensors as outputs. Copies of edge tensors received on other devices always count, with lifetimes
(see `pesto_ir.schedule.memory`). Edges become operands: a node's out-edges of one byte size share one
`blob[N]` result, so a tensor sent to several consumers is one value (and is sent once per device).
Nodes are reordered topologically; a cycle is an error naming its nodes.
"""

from __future__ import annotations

import heapq
import json
import json.decoder
from pathlib import Path
from typing import Any

from pesto_ir.cluster.model import suggestion_problem
from pesto_ir.ir.attributes import Attr, BoolAttr, BytesAttr, DictAttr, DurationAttr, StringAttr, to_attr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.types import BlobType
from pesto_ir.schedule.memory import output_bytes
from pesto_ir.util.errors import ParseError, SourceSpan
from pesto_ir.util.loader import (
    MAX_NESTING,
    MAX_SECONDS,
    ArgumentError,
    brief,
    decode_json,
    finite,
    read_source_text,
    span_at,
    too_deep,
)

FORMAT = "pesto-graph/1"
OPCODE = "opaque"


def load_json_graph(path: str | Path) -> Graph:
    return parse_json_graph(read_source_text(path), str(path))


def parse_json_graph(text: str, filename: str = "<json>") -> Graph:
    if not isinstance(text, str):
        raise ArgumentError(f"parse_json_graph() takes the JSON text as a str, got {type(text).__name__}")
    data = decode_json(text, filename)
    try:
        return graph_from_json(data, filename)
    except JsonGraphError as e:
        offset = _locate(text, e.path)
        if offset is not None:
            e.span = span_at(filename, text, offset)
        raise
    except RecursionError:  # a deep value kept as an attribute
        raise too_deep(text, filename) from None


class JsonGraphError(ParseError):
    """A validation error; `path` (keys and indexes) leads to the object or list at fault."""

    def __init__(self, message: str, span: SourceSpan, path: tuple[str | int, ...]) -> None:
        super().__init__(message, span)
        self.path = path


def _error(filename: str, message: str, *path: str | int) -> ParseError:
    return JsonGraphError(message, SourceSpan(filename, 1, 1), path)


def _locate(text: str, path: tuple[str | int, ...]) -> int | None:
    """Where in `text` the innermost object or list along `path` starts (at its first key or item).
    Walks the text again, skipping the values off the path with the C decoder."""
    decoder = json.JSONDecoder()
    skip = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]  # the C decoder's own; not in typeshed
    pos: int = skip(text, 0).end()
    try:
        for key in path:
            opener = text[pos]
            if (opener, type(key)) not in (("{", str), ("[", int)):
                break
            pos, i = skip(text, pos + 1).end(), 0
            while text[pos] not in "]}":
                if opener == "{":
                    k, pos = decoder.raw_decode(text, pos)
                    pos = skip(text, skip(text, pos).end() + 1).end()  # past the colon
                else:
                    k, i = i, i + 1
                if k == key:
                    break
                pos = skip(text, decoder.raw_decode(text, pos)[1]).end()
                pos = skip(text, pos + 1).end() if text[pos] == "," else pos
            else:
                return None
    except (ValueError, IndexError, RecursionError):
        return None
    first: int = skip(text, pos + 1).end()
    return first if text[pos] in "[{" and first < len(text) and text[first] not in "]}" else pos


def _name(x: Any) -> str | None:
    """A node id or group name: a string, or a number converted to its string; None otherwise."""
    if isinstance(x, str):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return str(x)
    return None


def _cost_attr(raw: Any, where: str, filename: str, at: tuple[str | int, ...]) -> Attr:
    def seconds(x: Any, what: str) -> DurationAttr:
        v = finite(x)
        if v is None or v < 0:
            raise _error(filename, f"{where}: {what} must be a non-negative number of seconds, got {brief(repr(x))}",
                         *at)
        if v > MAX_SECONDS:
            raise _error(filename, f"{where}: {what} {v:g} s is more than an op may take ({MAX_SECONDS:g} s)", *at)
        return DurationAttr(v)

    if isinstance(raw, dict):
        if not raw:
            raise _error(filename, f"{where}: cost per device kind is empty", *at)
        return DictAttr(tuple((str(k), seconds(v, f"cost[{k!r}]")) for k, v in raw.items()))
    return seconds(raw, "cost")


def _suggested_cluster(raw: Any, filename: str) -> Attr:
    """The `suggested_cluster` hint: an object whose `devices` and `memory`, when given, are usable."""
    at = ("suggested_cluster",)
    if (why := suggestion_problem(raw)) is not None:
        raise _error(filename, f"suggested_cluster{'' if why.startswith('must') else ':'} {why}", *at)
    if _depth(raw) > MAX_NESTING:
        raise _error(filename, f"suggested_cluster: nesting deeper than {MAX_NESTING} levels of lists and dicts", *at)
    return to_attr(raw)


def _depth(x: Any) -> int:
    """How deep lists and dicts nest in `x` (without recursion)."""
    deepest, stack = 0, [(x, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def graph_from_json(data: Any, filename: str = "<json>") -> Graph:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _error(filename, f"not a {FORMAT} document (its \"format\" must be \"{FORMAT}\")")
    nodes, edges = data.get("nodes"), data.get("edges", [])
    if not isinstance(nodes, list) or not isinstance(edges, list):
        raise _error(filename, "\"nodes\" and \"edges\" must be lists")
    name = _name(data.get("name") or Path(filename).stem)
    if name is None:
        raise _error(filename, f"\"name\" must be a string, got {brief(repr(data['name']))}")

    by_id: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    position: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if not isinstance(n, dict) or "id" not in n:
            raise _error(filename, f"nodes[{i}]: a node needs an \"id\"", "nodes", i)
        nid = _name(n["id"])
        if nid is None:
            raise _error(filename, f"nodes[{i}]: id must be a string or a number, got {brief(repr(n['id']))}",
                         "nodes", i)
        if nid in by_id:
            raise _error(filename, f"nodes[{i}]: duplicate node id '{nid}'", "nodes", i)
        by_id[nid] = n
        order.append(nid)
        position[nid] = i

    # out-edges grouped by size: one result value per (src, bytes)
    readers: dict[str, list[tuple[str, int]]] = {nid: [] for nid in order}
    preds: dict[str, set[str]] = {nid: set() for nid in order}
    for i, e in enumerate(edges):
        if not isinstance(e, dict):
            raise _error(filename, f"edges[{i}]: an edge is an object with src, dst, bytes", "edges", i)
        ends = []
        for end in ("src", "dst"):
            nid = _name(e.get(end))
            if nid not in by_id:
                raise _error(filename, f"edges[{i}]: {end} {brief(repr(e.get(end)))} is not a node id", "edges", i)
            ends.append(nid)
        src, dst = ends
        if src == dst:
            raise _error(filename, f"edges[{i}]: self-loop on node '{src}'", "edges", i)
        nbytes = e.get("bytes", 0)
        v = finite(nbytes)
        if v is None or v < 0 or v != int(v):
            raise _error(filename, f"edges[{i}] ({src} -> {dst}): bytes must be a whole non-negative number, "
                                   f"got {brief(repr(nbytes))}", "edges", i)
        readers[src].append((dst, int(v)))
        preds[dst].add(src)

    topo = _topological(order, preds, readers, filename)
    graph = Graph(name)
    if "suggested_cluster" in data:
        graph.attrs["suggested_cluster"] = _suggested_cluster(data["suggested_cluster"], filename)

    result_of: dict[tuple[str, int], Value] = {}
    # each node's operands, each value once in first-edge order (a dict: a node read by N others,
    # or reading N others, costs N, not N^2)
    operand_lists: dict[str, dict[Value, None]] = {nid: {} for nid in order}
    ops: dict[str, Op] = {}
    for nid in topo:
        n = by_id[nid]
        where = f"node '{nid}'"
        at = ("nodes", position[nid])
        sizes = list(dict.fromkeys(b for _, b in readers[nid])) or [0]  # in first-read order, each once
        attrs: dict[str, Attr] = {}
        if isinstance(n.get("name"), str) and n["name"] != nid:
            attrs["label"] = StringAttr(n["name"])
        if "cost" in n:
            attrs["cost"] = _cost_attr(n["cost"], where, filename, at)
        attrs.update(_memory_attrs(n, where, filename, at))
        if n.get("colocate") is not None:
            group = _name(n["colocate"])
            if group is None:
                raise _error(filename, f"{where}: colocate must be a group name (a string or a number), "
                                       f"got {brief(repr(n['colocate']))}", *at)
            attrs["colocate"] = StringAttr(group)
        attrs.update(_batch_attrs(n, where, filename, at))
        names = [nid] + [graph.fresh_name(f"{nid}.{b}B") for b in sizes[1:]]
        op = Op(nid, OPCODE, (), [BlobType(b) for b in sizes], attrs, names)
        graph.append(op)
        ops[nid] = op
        for b, r in zip(sizes, op.results):
            result_of[(nid, b)] = r
    for src in order:
        for dst, b in readers[src]:
            operand_lists[dst][result_of[(src, b)]] = None
    for nid, op in ops.items():
        op.set_operands(operand_lists[nid])
    return graph


def _batch_attrs(node: dict[str, Any], where: str, filename: str, at: tuple[str | int, ...]) -> dict[str, Attr]:
    """`backward` (for the pipeline schedules), `per_sample` (false: the node's cost does not scale
    with the batch, e.g. an optimizer update) and `param_bytes` (gradient bytes all-reduced across
    data-parallel replicas)."""
    attrs: dict[str, Attr] = {}
    for key in ("backward", "per_sample"):  # 1.5 or "no" is not read as a truth value
        if key in node and not isinstance(node[key], bool):
            raise _error(filename, f"{where}: {key} must be true or false, got {brief(repr(node[key]))}", *at)
    if node.get("backward"):
        attrs["backward"] = BoolAttr(True)
    if node.get("per_sample") is False:
        attrs["per_sample"] = BoolAttr(False)
    if "param_bytes" in node:
        v = finite(node["param_bytes"])
        if v is None or v < 0 or v != int(v) or isinstance(node["param_bytes"], bool):
            raise _error(filename, f"{where}: param_bytes must be a whole non-negative number of bytes, "
                                   f"got {brief(repr(node['param_bytes']))}", *at)
        if v:
            attrs["param_bytes"] = BytesAttr(int(v))
    return attrs


def _memory_attrs(node: dict[str, Any], where: str, filename: str, at: tuple[str | int, ...]) -> dict[str, Attr]:
    """`memory` and `activation` of a node: `memory` alone (resident, its output inside it), or
    `resident` and `activation` (either may be left out, for 0)."""
    def nbytes(key: str) -> int:
        m = node[key]
        v = finite(m)
        if v is None or v < 0 or v != int(v):
            raise _error(filename, f"{where}: {key} must be a whole non-negative number of bytes, got {brief(repr(m))}",
                         *at)
        return int(v)

    split = [k for k in ("resident", "activation") if k in node]
    if "memory" in node:
        if split:
            raise _error(filename, f"{where}: give either memory (resident for the whole step) or resident and "
                                   f"activation, not both", *at)
        return {"memory": BytesAttr(nbytes("memory")), "activation": BytesAttr(0)}
    if not split:
        return {}
    return {"memory": BytesAttr(nbytes("resident") if "resident" in node else 0),
            "activation": BytesAttr(nbytes("activation") if "activation" in node else 0)}


def _topological(order: list[str], preds: dict[str, set[str]], readers: dict[str, list[tuple[str, int]]],
                 filename: str) -> list[str]:
    index = {nid: i for i, nid in enumerate(order)}
    indeg = {nid: len(preds[nid]) for nid in order}
    ready = [index[nid] for nid in order if indeg[nid] == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        nid = order[heapq.heappop(ready)]
        out.append(nid)
        for dst in {d for d, _ in readers[nid]}:
            indeg[dst] -= 1
            if indeg[dst] == 0:
                heapq.heappush(ready, index[dst])
    if len(out) != len(order):
        stuck = [nid for nid in order if indeg[nid] > 0]
        raise _error(filename, f"the graph has a cycle through {len(stuck)} node(s), e.g. "
                               + ", ".join(f"'{s}'" for s in stuck[:5]), "nodes", index[stuck[0]])
    return out


def _memory_fields(op: Op) -> dict[str, int]:
    """The node fields that give `op`'s memory back: `memory` when its output is inside it."""
    memory, activation = op.get("memory"), op.get("activation")
    if activation is None:  # its results are its output: say so, or they would import as inside `memory`
        return {} if memory is None else {"resident": int(memory), "activation": output_bytes(op)}
    if int(activation) == 0 and memory is not None:
        return {"memory": int(memory)}
    return {"resident": int(memory or 0), "activation": int(activation)}


def graph_to_json(graph: Graph) -> dict[str, Any]:
    """Export the cost view of any graph as `pesto-graph/1` (edge bytes summed per op pair)."""
    nodes = []
    for op in graph.ops:
        node: dict[str, Any] = {"id": op.name}
        if "label" in op.attrs:
            node["name"] = op.get("label")
        cost = op.attrs.get("cost")
        if cost is not None:
            node["cost"] = cost.value
        node.update(_memory_fields(op))
        for key in ("colocate", "backward", "per_sample", "param_bytes"):
            if key in op.attrs:
                node[key] = op.get(key)
        nodes.append(node)
    edges: list[dict[str, Any]] = []
    for op in graph.ops:
        per_src: dict[str, int] = {}
        for v in dict.fromkeys(op.operands):
            if v.owner is not None:
                per_src[v.owner.name] = per_src.get(v.owner.name, 0) + v.type.nbytes
        edges.extend({"src": s, "dst": op.name, "bytes": b} for s, b in per_src.items())
    out: dict[str, Any] = {"format": FORMAT, "name": graph.name, "nodes": nodes, "edges": edges}
    if "suggested_cluster" in graph.attrs:
        out["suggested_cluster"] = graph.attrs["suggested_cluster"].value
    return out
