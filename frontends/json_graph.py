"""Import (and export) `pesto-graph/1` cost graphs: what other profilers write.

Each node becomes an `opaque` op carrying `cost`, `memory`, `colocate`, `backward` and its
original `name` as `label`.

Memory: a node's `memory` is held for the whole step (its resident bytes), as profilers that fill it
with a node's output size expect; such a node's output is inside it, so its op gets `activation = 0`.
A node may instead split it into `resident` bytes (whole step) and `activation` bytes (its output,
held from its start until its readers are done). A node that declares none of these holds its edge
tensors as outputs. Copies of edge tensors received on other devices always count, with lifetimes
(see `pesto_ir.memory`). Edges become operands: a node's out-edges of one byte size share one
`blob[N]` result, so a tensor sent to several consumers is one value (and is sent once per device).
Nodes are reordered topologically; a cycle is an error naming its nodes.
"""

from __future__ import annotations

import heapq
import json
import math
from pathlib import Path
from typing import Any

from pesto_ir.attributes import Attr, BoolAttr, BytesAttr, DictAttr, DurationAttr, StringAttr, to_attr
from pesto_ir.errors import ParseError, SourceSpan
from pesto_ir.ir import Graph, Op, Value
from pesto_ir.loader import read_source_text
from pesto_ir.memory import output_bytes
from pesto_ir.types import BlobType

FORMAT = "pesto-graph/1"
OPCODE = "opaque"


def load_json_graph(path: str | Path) -> Graph:
    return parse_json_graph(read_source_text(path), str(path))


def parse_json_graph(text: str, filename: str = "<json>") -> Graph:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(f"invalid JSON: {e.msg}", SourceSpan(filename, e.lineno, e.colno, text)) from None
    return graph_from_json(data, filename)


def _error(filename: str, message: str) -> ParseError:
    return ParseError(message, SourceSpan(filename, 1, 1))


def _cost_attr(raw: Any, where: str, filename: str) -> Attr:
    def seconds(x: Any, what: str) -> DurationAttr:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            raise _error(filename, f"{where}: {what} must be a non-negative number of seconds, got {x!r}")
        return DurationAttr(float(x))

    if isinstance(raw, dict):
        if not raw:
            raise _error(filename, f"{where}: cost per device kind is empty")
        return DictAttr(tuple((str(k), seconds(v, f"cost[{k!r}]")) for k, v in raw.items()))
    return seconds(raw, "cost")


def graph_from_json(data: Any, filename: str = "<json>") -> Graph:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _error(filename, f"not a {FORMAT} document (its \"format\" must be \"{FORMAT}\")")
    nodes, edges = data.get("nodes"), data.get("edges", [])
    if not isinstance(nodes, list) or not isinstance(edges, list):
        raise _error(filename, "\"nodes\" and \"edges\" must be lists")

    by_id: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for i, n in enumerate(nodes):
        if not isinstance(n, dict) or "id" not in n:
            raise _error(filename, f"nodes[{i}]: a node needs an \"id\"")
        nid = str(n["id"])
        if nid in by_id:
            raise _error(filename, f"nodes[{i}]: duplicate node id '{nid}'")
        by_id[nid] = n
        order.append(nid)

    # out-edges grouped by size: one result value per (src, bytes)
    readers: dict[str, list[tuple[str, int]]] = {nid: [] for nid in order}
    preds: dict[str, set[str]] = {nid: set() for nid in order}
    for i, e in enumerate(edges):
        if not isinstance(e, dict):
            raise _error(filename, f"edges[{i}]: an edge is an object with src, dst, bytes")
        src, dst = str(e.get("src")), str(e.get("dst"))
        for end, nid in (("src", src), ("dst", dst)):
            if nid not in by_id:
                raise _error(filename, f"edges[{i}]: {end} '{nid}' is not a node id")
        if src == dst:
            raise _error(filename, f"edges[{i}]: self-loop on node '{src}'")
        nbytes = e.get("bytes", 0)
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) \
                or nbytes < 0 or nbytes != int(nbytes):
            raise _error(filename, f"edges[{i}] ({src} -> {dst}): bytes must be a whole non-negative number")
        readers[src].append((dst, int(nbytes)))
        preds[dst].add(src)

    topo = _topological(order, preds, readers, filename)
    graph = Graph(str(data.get("name") or Path(filename).stem))
    for key in ("suggested_cluster",):
        if key in data:
            graph.attrs[key] = to_attr(data[key])

    result_of: dict[tuple[str, int], Value] = {}
    operand_lists: dict[str, list[Value]] = {nid: [] for nid in order}
    ops: dict[str, Op] = {}
    for nid in topo:
        n = by_id[nid]
        where = f"node '{nid}'"
        sizes: list[int] = []
        for _, b in readers[nid]:
            if b not in sizes:
                sizes.append(b)
        sizes = sizes or [0]
        attrs: dict[str, Attr] = {}
        if isinstance(n.get("name"), str) and n["name"] != nid:
            attrs["label"] = StringAttr(n["name"])
        if "cost" in n:
            attrs["cost"] = _cost_attr(n["cost"], where, filename)
        attrs.update(_memory_attrs(n, where, filename))
        if n.get("colocate") is not None:
            attrs["colocate"] = StringAttr(str(n["colocate"]))
        if n.get("backward"):
            attrs["backward"] = BoolAttr(True)
        names = [nid] + [graph.fresh_name(f"{nid}.{b}B") for b in sizes[1:]]
        op = Op(nid, OPCODE, (), [BlobType(b) for b in sizes], attrs, names)
        graph.append(op)
        ops[nid] = op
        for b, r in zip(sizes, op.results):
            result_of[(nid, b)] = r
    for src in order:
        for dst, b in readers[src]:
            v = result_of[(src, b)]
            if v not in operand_lists[dst]:
                operand_lists[dst].append(v)
    for nid, op in ops.items():
        op.set_operands(operand_lists[nid])
    return graph


def _memory_attrs(node: dict[str, Any], where: str, filename: str) -> dict[str, Attr]:
    """`memory` and `activation` of a node: `memory` alone (resident, its output inside it), or
    `resident` and `activation` (either may be left out, for 0)."""
    def nbytes(key: str) -> int:
        m = node[key]
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m < 0 or m != int(m):
            raise _error(filename, f"{where}: {key} must be a whole non-negative number of bytes, got {m!r}")
        return int(m)

    split = [k for k in ("resident", "activation") if k in node]
    if "memory" in node:
        if split:
            raise _error(filename, f"{where}: give either memory (resident for the whole step) or resident and "
                                   f"activation, not both")
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
                               + ", ".join(f"'{s}'" for s in stuck[:5]))
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
        for key in ("colocate", "backward"):
            if key in op.attrs:
                node[key] = op.get(key)
        nodes.append(node)
    edges = []
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
