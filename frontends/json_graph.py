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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pesto_ir.cluster.model import suggestion_problem
from pesto_ir.ir.attributes import Attr, BoolAttr, BytesAttr, DictAttr, DurationAttr, StringAttr, to_attr
from pesto_ir.ir.graph import Graph, Op, Value
from pesto_ir.ir.types import BlobType
from pesto_ir.schedule.memory import output_bytes
from pesto_ir.util.errors import ParseError, SourceSpan
from pesto_ir.util.gc_pause import gc_paused
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
    with gc_paused():  # decoding builds an object per node and per edge too
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

    with gc_paused():
        by_id, position = _index_nodes(nodes, filename)
        order = list(by_id)
        readers, writers, in_order = _read_edges(edges, position, filename)
        topo = order if in_order else _topological(order, writers, readers, filename)  # a sorted one is its own
        graph = Graph(name)
        if "suggested_cluster" in data:
            graph.attrs["suggested_cluster"] = _suggested_cluster(data["suggested_cluster"], filename)
        _add_ops(graph, topo, by_id, position, readers, writers, filename)
    return graph


# One edge: the other end's node id and the edge's bytes.
Edge = tuple[str, int]
_NO_EDGES: tuple[Edge, ...] = ()
_EXACT_INT = 1 << 53  # whole numbers up to here are the same after `float` (what `finite` reads)


def _index_nodes(nodes: list[Any], filename: str) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """Each node by its id (in file order), and each id's index in `nodes`."""
    by_id: dict[str, dict[str, Any]] = {}
    position: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if not isinstance(n, dict) or "id" not in n:
            raise _error(filename, f"nodes[{i}]: a node needs an \"id\"", "nodes", i)
        nid = n["id"]
        if type(nid) is not str:
            nid = _name(nid)
            if nid is None:
                raise _error(filename, f"nodes[{i}]: id must be a string or a number, got {brief(repr(n['id']))}",
                             "nodes", i)
        if nid in by_id:
            raise _error(filename, f"nodes[{i}]: duplicate node id '{nid}'", "nodes", i)
        by_id[nid] = n
        position[nid] = i
    return by_id, position


def _read_edges(edges: list[Any], position: dict[str, int],
                filename: str) -> tuple[dict[str, list[Edge]], dict[str, list[Edge]], bool]:
    """Each node's out-edges (reader, bytes) and in-edges (writer, bytes), in edge order (only
    nodes that have some), and whether every edge runs from an earlier node to a later one."""
    readers: dict[str, list[Edge]] = {}
    writers: dict[str, list[Edge]] = {}
    in_order = True
    for i, e in enumerate(edges):
        if not isinstance(e, dict):
            raise _error(filename, f"edges[{i}]: an edge is an object with src, dst, bytes", "edges", i)
        src, dst = _edge_end(e, "src", position, filename, i), _edge_end(e, "dst", position, filename, i)
        if src == dst:
            raise _error(filename, f"edges[{i}]: self-loop on node '{src}'", "edges", i)
        nbytes = e.get("bytes", 0)
        if type(nbytes) is not int or not 0 <= nbytes <= _EXACT_INT:  # else it is its own whole number
            v = finite(nbytes)
            if v is None or v < 0 or v != int(v):
                raise _error(filename, f"edges[{i}] ({src} -> {dst}): bytes must be a whole non-negative number, "
                                       f"got {brief(repr(nbytes))}", "edges", i)
            nbytes = int(v)
        _add_edge(readers, src, (dst, nbytes))
        _add_edge(writers, dst, (src, nbytes))
        in_order = in_order and position[src] < position[dst]
    return readers, writers, in_order


def _edge_end(edge: dict[str, Any], end: str, position: dict[str, int], filename: str, i: int) -> str:
    """The node id at `end` ("src" or "dst") of edges[i]."""
    raw = edge.get(end)
    nid = raw if type(raw) is str else _name(raw)
    if nid is None or nid not in position:
        raise _error(filename, f"edges[{i}]: {end} {brief(repr(raw))} is not a node id", "edges", i)
    return nid


def _add_edge(table: dict[str, list[Edge]], nid: str, edge: Edge) -> None:
    """Append `edge` to node `nid`'s list in `table` (which has lists only for nodes with edges)."""
    found = table.get(nid)
    if found is None:
        table[nid] = [edge]
    else:
        found.append(edge)


def _add_ops(graph: Graph, topo: list[str], by_id: dict[str, dict[str, Any]], position: dict[str, int],
             readers: dict[str, list[Edge]], writers: dict[str, list[Edge]], filename: str) -> None:
    """One op per node, in topological order: a result per distinct out-edge size (one `blob[0]`
    without out-edges); its operands, each value once, in the file order of the nodes written,
    then edge order (a node read by N others, or reading N others, costs N, not N^2)."""
    result_of: dict[tuple[str, int], Value] = {}
    blob_types: dict[int, BlobType] = {}  # types are frozen: one per size
    for nid in topo:
        out_edges = readers.get(nid, _NO_EDGES)
        sizes = _distinct_sizes(out_edges)
        attrs = _node_attrs(by_id[nid], nid, position[nid], filename)
        names = [nid] if len(sizes) == 1 else [nid] + [graph.fresh_name(f"{nid}.{b}B") for b in sizes[1:]]
        types = [blob_types[b] if b in blob_types else blob_types.setdefault(b, BlobType(b)) for b in sizes]
        op = Op(nid, OPCODE, [result_of[k] for k in _operand_keys(writers.get(nid, _NO_EDGES), position)],
                types, attrs, names)
        graph.append(op)
        result_of.update(zip([(nid, b) for b in sizes], op.results))


def _distinct_sizes(out_edges: Sequence[Edge]) -> list[int]:
    """The byte sizes of a node's out-edges in first-read order, each once; [0] when it has none."""
    if len(out_edges) < 2:
        return [out_edges[0][1]] if out_edges else [0]
    return list(dict.fromkeys([b for _, b in out_edges]))


def _operand_keys(in_edges: Sequence[Edge], position: dict[str, int]) -> Sequence[Edge]:
    """A node's distinct (writer, bytes) in-edges, in the file order of the writers, then edge order."""
    if len(in_edges) < 2:
        return in_edges
    return list(dict.fromkeys(sorted(in_edges, key=lambda edge: position[edge[0]])))  # a stable sort


def _node_attrs(n: dict[str, Any], nid: str, index: int, filename: str) -> dict[str, Attr]:
    """The attributes of node `nid` (nodes[index])."""
    where = f"node '{nid}'"
    at = ("nodes", index)
    attrs: dict[str, Attr] = {}
    label = n.get("name")
    if isinstance(label, str) and label != nid:
        attrs["label"] = StringAttr(label)
    if "cost" in n:
        cost = n["cost"]
        attrs["cost"] = (DurationAttr(cost) if type(cost) is float and 0 <= cost <= MAX_SECONDS
                         else _cost_attr(cost, where, filename, at))
    attrs.update(_memory_attrs(n, where, filename, at))
    if n.get("colocate") is not None:
        group = _name(n["colocate"])
        if group is None:
            raise _error(filename, f"{where}: colocate must be a group name (a string or a number), "
                                   f"got {brief(repr(n['colocate']))}", *at)
        attrs["colocate"] = StringAttr(group)
    if "backward" in n or "per_sample" in n or "param_bytes" in n:
        attrs.update(_batch_attrs(n, where, filename, at))
    return attrs


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
    split = "resident" in node or "activation" in node
    if "memory" in node:
        if split:
            raise _error(filename, f"{where}: give either memory (resident for the whole step) or resident and "
                                   f"activation, not both", *at)
        return {"memory": BytesAttr(_whole_bytes(node, "memory", where, filename, at)), "activation": BytesAttr(0)}
    if not split:
        return {}
    return {"memory": BytesAttr(_whole_bytes(node, "resident", where, filename, at) if "resident" in node else 0),
            "activation": BytesAttr(_whole_bytes(node, "activation", where, filename, at) if "activation" in node
                                    else 0)}


def _whole_bytes(node: dict[str, Any], key: str, where: str, filename: str, at: tuple[str | int, ...]) -> int:
    """`node[key]` as a whole non-negative number of bytes (a number written 4096.0 too)."""
    m = node[key]
    if type(m) is int and 0 <= m <= _EXACT_INT:  # what the general path gives it back as
        return m
    v = finite(m)
    if v is None or v < 0 or v != int(v):
        raise _error(filename, f"{where}: {key} must be a whole non-negative number of bytes, got {brief(repr(m))}",
                     *at)
    return int(v)


def _topological(order: list[str], writers: dict[str, list[Edge]], readers: dict[str, list[Edge]],
                 filename: str) -> list[str]:
    """Kahn's order, always taking the ready node that comes first in the file; a cycle is an error."""
    index = {nid: i for i, nid in enumerate(order)}
    indeg = {nid: len({src for src, _ in writers.get(nid, _NO_EDGES)}) for nid in order}
    ready = [index[nid] for nid in order if indeg[nid] == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        nid = order[heapq.heappop(ready)]
        out.append(nid)
        for dst in {d for d, _ in readers.get(nid, _NO_EDGES)}:
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
