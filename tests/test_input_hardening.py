"""Bad input never crashes, hangs or lies: each case is a clean PestoError naming what is wrong."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import jax
import pytest

import pesto_ir
from pesto_ir import ParseError, PestoError
from pesto_ir.cluster.devices import Device, Link
from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.model import Cluster
from pesto_ir.frontends.json_graph import graph_to_json, parse_json_graph
from pesto_ir.passmanager import Pipeline
from pesto_ir.util.loader import MAX_NESTING, write_atomic

ENGINES = ("fast", "lark")


def graph_doc(**top: Any) -> dict[str, Any]:
    return {"format": "pesto-graph/1", "nodes": [{"id": "a", "cost": 0.001}], **top}


def node_doc(**fields: Any) -> str:
    return json.dumps(graph_doc(nodes=[{"id": "a", **fields}]))


def one_op(attrs: str) -> str:
    return f"graph @g() {{\n  %x = foo() {{{attrs}}} : f32[2]\n  return %x\n}}\n"


# ---------------------------------------------------------------- 1. wrong argument types

@pytest.mark.parametrize(("call", "expected"), [
    (lambda: pesto_ir.parse(None), "takes the .pir text as a str, got NoneType"),
    (lambda: pesto_ir.parse(b"graph @g() {}"), r"got bytes \(decode"),
    (lambda: pesto_ir.parse("graph @g() {}", None), "file name as a str"),
    (lambda: pesto_ir.load(None), "takes a file path .* got NoneType"),
    (lambda: pesto_ir.load(123), "takes a file path .* got int"),
    (lambda: parse_json_graph(None), "JSON text as a str"),
    (lambda: pesto_ir.parse("graph @g() {}", engine="turbo"), r"unknown parser engine 'turbo' \(known: fast, lark\)"),
    (lambda: Pipeline.parse(None), r"Pipeline.parse\(\) takes the pipeline as a str .* got NoneType"),
    (lambda: Pipeline.parse(b"verify"), r"Pipeline.parse\(\) takes the pipeline as a str .* got bytes"),
    (lambda: Pipeline.parse("verify", None), r"Pipeline.parse\(\) takes the source name as a str, got NoneType"),
    (lambda: pesto_ir.parallelize(123), "parallelize needs a function to plan"),
    (lambda: pesto_ir.parallelize(abs, cluster="h100"), "cluster must be a pesto_ir Cluster"),
    (lambda: pesto_ir.parallelize(abs, compiler_options="fast"), "compiler_options must be a dict"),
    (lambda: pesto_ir.parallelize(abs, devices={0: jax.devices()[0]}), "keyed by cluster device names"),
])
def test_wrong_arguments_are_refused_plainly(call: Any, expected: str) -> None:
    with pytest.raises(PestoError, match=expected) as e:
        call()
    assert isinstance(e.value, TypeError)  # what Python itself would raise, so `except TypeError` works too


# ---------------------------------------------------------------- 2. deep nesting

@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("depth", [MAX_NESTING, 5000])
def test_deep_pir_attribute_is_a_located_error(engine: str, depth: int) -> None:
    text = "// deep\ngraph @g() attributes {a = " + "[" * depth + "]" * depth + "} {}\n"
    with pytest.raises(ParseError, match=f"nesting deeper than {MAX_NESTING} levels") as e:
        pesto_ir.parse(text, "deep.pir", engine=engine)
    # the bracket that goes one level too deep: the dict's { is the first level
    assert str(e.value.span) == f"deep.pir:2:{len('graph @g() attributes {a = ') + MAX_NESTING}"


@pytest.mark.parametrize("engine", ENGINES)
def test_nesting_at_the_limit_parses_verifies_and_prints(engine: str) -> None:
    d = MAX_NESTING - 2  # inside the graph body and the op's attribute dict
    g = pesto_ir.parse(one_op("b = " + "[" * d + "]" * d), engine=engine)
    pesto_ir.verify(g)
    assert pesto_ir.parse(str(g)) is not None
    nested = "graph @b0() {\n}"
    for k in range(1, MAX_NESTING // 2):  # graphs in graphs: two levels each
        nested = f"graph @b{k}() {{\n  @o noop() {{body = {nested}}}\n}}"
    g = pesto_ir.parse(nested, engine=engine)
    pesto_ir.verify(g)
    assert pesto_ir.parse(str(g)) is not None


def test_deep_json_is_a_located_error(tmp_path: Path) -> None:
    depth = 100_000
    p = tmp_path / "deep.json"
    p.write_text('{"format": "pesto-graph/1", "nodes": [],\n "x": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(ParseError, match="nesting deeper than") as e:
        pesto_ir.load(p)
    assert (e.value.span.file, e.value.span.line) == (str(p), 2)


def test_deep_suggested_cluster_is_refused() -> None:
    d = 300  # json.loads takes it, but printing the graph would recurse too deep
    with pytest.raises(ParseError, match="suggested_cluster: nesting deeper than"):
        parse_json_graph(json.dumps(graph_doc(suggested_cluster={"x": json.loads("[" * d + "]" * d)})))


# ---------------------------------------------------------------- 3. huge, infinite and NaN costs and sizes

@pytest.mark.parametrize(("field", "literal", "message"), [
    ("cost", "1" + "0" * 400, "node 'a': cost must be a non-negative number of seconds, got 1000"),
    ("cost", "NaN", "node 'a': cost must be a non-negative number of seconds, got nan"),
    ("cost", "1e12", r"node 'a': cost 1e\+12 s is more than an op may take \(1e\+06 s\)"),
    ("cost", '{"v100": Infinity}', r"node 'a': cost\['v100'\] must be a non-negative number of seconds, got inf"),
    ("memory", "1" + "0" * 400, "node 'a': memory must be a whole non-negative number of bytes"),
    ("activation", "Infinity", "node 'a': activation must be a whole non-negative number of bytes"),
])
def test_json_huge_or_non_finite_numbers(field: str, literal: str, message: str) -> None:
    text = '{"format": "pesto-graph/1", "nodes": [{"id": "a", "' + field + '": ' + literal + "}]}"
    with pytest.raises(ParseError, match=message) as e:
        parse_json_graph(text)
    assert len(str(e.value)) < 200  # a 400-digit number is cut short


def test_json_huge_edge_bytes() -> None:
    text = ('{"format": "pesto-graph/1", "nodes": [{"id": "a"}, {"id": "b"}],'
            ' "edges": [{"src": "a", "dst": "b", "bytes": 1' + "0" * 400 + "}]}")
    with pytest.raises(ParseError, match=r"edges\[0\] \(a -> b\): bytes must be a whole non-negative number"):
        parse_json_graph(text)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("attrs", "message"), [
    ("cost = 1e400", "op 'x': cost must be a non-negative number of seconds, got inf"),
    ("cost = 1e400s", "op 'x': cost must be a non-negative number of seconds, got inf"),
    ("cost = nan", "op 'x': cost must be a non-negative number of seconds, got nan"),
    ("cost = 2e6s", r"op 'x': cost 2e\+06 s is more than an op may take \(1e\+06 s\)"),
    ("cost = -1ms", "op 'x': cost must be a non-negative number of seconds"),
    ("cost = 1" + "0" * 400, "op 'x': cost must be a non-negative number of seconds, got 1000"),
    ("cost = {v100 = 1ms, cpu = inf}", r"op 'x': cost\['cpu'\] must be a non-negative number of seconds, got inf"),
    ("memory = inf", "op 'x': memory must be a whole non-negative number of bytes, got inf"),
    ("activation = nan", "op 'x': activation must be a whole non-negative number of bytes, got nan"),
    ("workspace = -4", "op 'x': workspace must be a whole non-negative number of bytes, got -4"),
])
def test_pir_non_finite_costs_and_sizes(engine: str, attrs: str, message: str) -> None:
    with pytest.raises(ParseError, match=message) as e:
        pesto_ir.parse(one_op(attrs), "m.pir", engine=engine)
    assert str(e.value.span) == "m.pir:2:8"  # the op


@pytest.mark.parametrize("engine", ENGINES)
def test_pir_good_costs_and_sizes_still_parse(engine: str) -> None:
    g = pesto_ir.parse(one_op("cost = {v100 = 1ms, cpu = 0.5}, memory = 4MiB, activation = 1e6, workspace = 0"),
                       engine=engine)
    assert g.op("x").get("memory") == 4 << 20


# ---------------------------------------------------------------- 4. suggested_cluster

@pytest.mark.parametrize(("hint", "message"), [
    ("lots", "suggested_cluster must be an object"),
    ([4], "suggested_cluster must be an object"),
    ({"devices": 0}, "suggested_cluster: devices must be a whole number >= 1, got 0"),
    ({"devices": 2.5}, "suggested_cluster: devices must be a whole number >= 1"),
    ({"devices": True}, "suggested_cluster: devices must be a whole number >= 1"),
    ({"devices": "4"}, "suggested_cluster: devices must be a whole number >= 1"),
    ({"memory": 0}, "suggested_cluster: memory must be a positive number of bytes"),
    ({"memory": -1e9}, "suggested_cluster: memory must be a positive number of bytes"),
    ({"memory": math.nan}, "suggested_cluster: memory must be a positive number of bytes"),
    ({"memory": "8GB"}, "suggested_cluster: memory must be a positive number of bytes"),
])
def test_bad_suggested_cluster(hint: Any, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_json_graph(json.dumps(graph_doc(suggested_cluster=hint)))


def test_good_suggested_cluster_is_kept() -> None:
    g = parse_json_graph(json.dumps(graph_doc(suggested_cluster={"devices": 4, "memory": 8e10, "note": "x"})))
    assert graph_to_json(g)["suggested_cluster"] == {"devices": 4, "memory": 8e10, "note": "x"}


# ---------------------------------------------------------------- 5. colocate and ids are names

@pytest.mark.parametrize("group", [["x"], {"g": 1}, True])
def test_colocate_must_be_a_name(group: Any) -> None:
    with pytest.raises(ParseError, match="node 'a': colocate must be a group name"):
        parse_json_graph(node_doc(colocate=group))


@pytest.mark.parametrize("key", ["backward", "per_sample"])
@pytest.mark.parametrize("value", [1.5, 1, 0, "yes", "false", None, [True]])
def test_flags_must_be_booleans(key: str, value: Any) -> None:
    """`"backward": 1.5` was read as true: a flag is true or false, nothing else."""
    with pytest.raises(ParseError, match=f"node 'a': {key} must be true or false, got "):
        parse_json_graph(node_doc(**{key: value}))


def test_boolean_flags_still_read() -> None:
    g = parse_json_graph(json.dumps(graph_doc(nodes=[{"id": "a", "backward": True, "per_sample": False},
                                                    {"id": "b", "backward": False, "per_sample": True}])))
    assert g.op("a").get("backward") is True and g.op("a").get("per_sample") is False
    assert "backward" not in g.op("b").attrs and "per_sample" not in g.op("b").attrs


def test_colocate_number_becomes_its_string() -> None:
    assert parse_json_graph(node_doc(colocate=3)).op("a").get("colocate") == "3"


@pytest.mark.parametrize("nid", [["a"], {"a": 1}, None, True])
def test_node_id_must_be_a_name(nid: Any) -> None:
    with pytest.raises(ParseError, match=r"nodes\[0\]: id must be a string or a number"):
        parse_json_graph(json.dumps(graph_doc(nodes=[{"id": nid}])))


def test_edge_end_must_be_a_node_id() -> None:
    doc = graph_doc(nodes=[{"id": "a"}, {"id": "['a']"}], edges=[{"src": ["a"], "dst": "['a']"}])
    with pytest.raises(ParseError, match=r"edges\[0\]: src \['a'\] is not a node id"):
        parse_json_graph(json.dumps(doc))


# ---------------------------------------------------------------- 6. pesto-cluster/1

def cluster_doc(**top: Any) -> dict[str, Any]:
    return {"format": "pesto-cluster/1", "devices": [{"name": "a", "kind": "v100"}, {"name": "b", "kind": "v100"}],
            **top}


def link(**fields: Any) -> dict[str, Any]:
    return cluster_doc(links=[{"src": "a", "dst": "b", **fields}])


@pytest.mark.parametrize(("data", "message"), [
    (link(latency=math.nan), r"links\[0\]: latency must be a finite number of seconds >= 0, got nan"),
    (link(latency=math.inf), r"links\[0\]: latency must be a finite number of seconds >= 0, got inf"),
    (link(latency=-1e-6), r"links\[0\]: latency must be"),
    (link(latency=10**400), r"links\[0\]: latency must be .* \(401 characters\)"),
    (link(bandwidth=0), r"links\[0\]: bandwidth must be positive"),
    (link(bandwidth=-1), r"links\[0\]: bandwidth must be positive"),
    (link(bandwidth=math.nan), r"links\[0\]: bandwidth must be positive"),
    (link(bandwidth="fast"), r"links\[0\]: bandwidth must be positive"),
    (cluster_doc(link={"latency": math.nan}), "link: latency must be"),
    (cluster_doc(link={"bandwidth": 0}), "link: bandwidth must be positive"),
    (cluster_doc(link=[1]), '"link" must be an object'),
    (cluster_doc(links="all"), '"links" must be a list'),
    (cluster_doc(links=["a->b"]), r"links\[0\]: a link is an object"),
    (link(dst="z"), r"links\[0\]: dst 'z' is not a device name \(devices: a, b\)"),
    (link(src=["a"]), r"links\[0\]: src \['a'\] is not a device name"),
    (link(dst="a"), r"links\[0\]: src and dst are both 'a'"),
    ({"format": "pesto-cluster/1", "devices": [{"name": "a", "kind": "v100", "memory": math.nan}]}, '"memory"'),
    ({"format": "pesto-cluster/1", "devices": [{"name": "a", "kind": "v100", "memory": 0}]}, '"memory"'),
    ({"format": "pesto-cluster/1", "devices": [{"name": "a", "kind": "v100", "memory": 10**400}]}, '"memory"'),
    ({"format": "pesto-cluster/1", "devices": [{"name": "a", "kind": "v100", "memory": True}]}, '"memory"'),
])
def test_cluster_json_errors_name_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        Cluster.from_json(data, "c.json")


def test_duplicate_device_name_is_said_to_be_duplicated() -> None:
    data = {"format": "pesto-cluster/1", "devices": [{"name": "a", "kind": "v100"}, {"name": "a", "kind": "v100"}],
            "links": [{"src": "a", "dst": "a"}]}
    with pytest.raises(ClusterError, match=r"duplicate device names: devices\[0\] and devices\[1\] are both 'a'"):
        Cluster.from_json(data, "c.json")
    with pytest.raises(ClusterError, match="duplicate device names: 'a' is the name of 2 devices"):
        Cluster([Device.of_kind("a", "v100"), Device.of_kind("a", "v100")], {})


@pytest.mark.parametrize(("call", "message"), [
    (lambda: Cluster.homogeneous(0), "at least 1"),
    (lambda: Cluster.homogeneous(-3), "at least 1"),
    (lambda: Cluster.homogeneous(2.5), "must be a whole number, got 2.5"),
    (lambda: Cluster.homogeneous("2"), "must be a whole number, got '2'"),
    (lambda: Cluster.homogeneous(True), "must be a whole number, got True"),
    (lambda: Cluster.homogeneous(2, None), "a device kind is a name"),
    (lambda: Cluster.homogeneous(2, latency=math.nan), "latency must be"),
    (lambda: Cluster.homogeneous(2, bandwidth=0), "bandwidth must be positive"),
    (lambda: Cluster.homogeneous(2, memory=-1), "memory must be a positive number"),
    (lambda: Cluster.homogeneous(2).with_memory(math.nan), "memory must be a positive number of bytes, got nan"),
    (lambda: Cluster.homogeneous(2).with_memory(0), "memory must be a positive number of bytes, got 0"),
    (lambda: Cluster.homogeneous(2).with_memory(-5.0), "memory must be a positive number of bytes"),
    (lambda: Link("a", "b", math.inf, 1e9), "link a->b: latency must be"),
    (lambda: Link("a", "b", 0.0, math.nan), "link a->b: bandwidth must be positive"),
    (lambda: Device("a", "x", 1e12, 1e12, math.nan), "device a: memory must be a positive number"),
    (lambda: Cluster.load(None), "takes a file path"),
])
def test_cluster_builders_refuse_bad_figures(call: Any, message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        call()


def test_unlimited_memory_is_still_allowed() -> None:
    assert Cluster.homogeneous(2).with_memory(math.inf).device("gpu0").memory == math.inf


def test_cluster_load_refuses_non_utf8_and_deep_json(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_bytes(b'{"format": "\xff"}')
    with pytest.raises(ClusterError, match="not UTF-8"):
        Cluster.load(p)
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ClusterError, match="nested deeper than"):
        Cluster.load(p)


# ---------------------------------------------------------------- 7. JSON validation errors are located

def test_json_validation_error_points_at_the_node(tmp_path: Path) -> None:
    doc = graph_doc(nodes=[{"id": "a", "cost": 1}, {"id": "b", "cost": -1}], edges=[{"src": "a", "dst": "b"}])
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc, indent=2))
    with pytest.raises(ParseError, match="node 'b': cost") as e:
        pesto_ir.load(p)
    line = json.dumps(doc, indent=2).splitlines().index('      "id": "b",') + 1
    assert (e.value.span.file, e.value.span.line) == (str(p), line)
    assert '"id": "b"' in e.value.format()  # with the line itself under the message


def test_json_edge_error_points_at_the_edge() -> None:
    text = ('{"format": "pesto-graph/1",\n "nodes": [{"id": "a"}, {"id": "b"}],\n'
            ' "edges": [{"src": "a", "dst": "b"},\n           {"src": "a", "dst": "b", "bytes": -1}]}')
    with pytest.raises(ParseError, match=r"edges\[1\]") as e:
        parse_json_graph(text, "g.json")
    assert str(e.value.span) == "g.json:4:13"


@pytest.mark.parametrize("engine", ["fast", "lark"])
@pytest.mark.parametrize("text", ['"bad\\q"', '"bad\\u12"', '"\\x41"'])
def test_a_string_with_an_invalid_escape_is_a_located_error(engine: str, text: str) -> None:
    source = "graph @g() {\n  %a = opaque() {note = " + text + ", cost = 1ms} : blob[4]\n}\n"
    with pytest.raises(ParseError) as e:
        pesto_ir.parse(source, engine=engine)
    assert str(e.value).startswith("<string>:2:25:")


def test_a_number_with_too_many_digits_is_a_clean_error(tmp_path: Path) -> None:
    huge = "1" * 5000
    with pytest.raises(ParseError, match=r"<json>:1:61: a number has more digits than can be read \(4300 at most\)"):
        parse_json_graph('{"format": "pesto-graph/1", "nodes": [{"id": "a", "memory": ' + huge + "}]}")
    path = tmp_path / "c.json"
    path.write_text('{"format": "pesto-cluster/1", "devices": [{"name": "a", "kind": "h100", "memory": ' + huge + "}]}")
    with pytest.raises(ClusterError, match="invalid JSON"):
        Cluster.load(path)


@pytest.mark.parametrize("junk", [
    "graph @g() {\n  %a = opaque() {note = " + "x" * 1_000_000 + "} : blob[4]\n}\n",  # one huge token
    "z" * 1_000_000 + "\n",  # a huge word where a graph should start (its nesting scan was quadratic)
])
def test_a_huge_junk_line_gives_a_short_error(junk: str) -> None:
    with pytest.raises(ParseError) as e:
        pesto_ir.parse(junk)
    text = e.value.format()
    assert len(text) < 2000 and "characters)" in text


def test_a_long_line_is_shown_around_the_caret() -> None:
    line = "  %a = opaque() {cost = 1ms, note = \"" + "n" * 500 + "\", x = $} : blob[4]"
    with pytest.raises(ParseError) as e:
        pesto_ir.parse("graph @g() {\n" + line + "\n}\n")
    src, caret = e.value.format().split("\n")[1:3]
    assert src.startswith("  ...") and len(src) < 120 and src[caret.index("^")] == "$"


def test_a_text_cut_short_is_a_located_error_not_an_index_error() -> None:
    """Found by the fuzz tests: the fast parser read one token past the end of a truncated text."""
    text = (Path(__file__).resolve().parent.parent / "examples" / "lstm2_unrolled.pir").read_text()
    for cut in (len(text) // 3, len(text) // 2, len(text) - 5):
        with pytest.raises(ParseError):
            pesto_ir.parse(text[:cut])


@pytest.mark.parametrize("tail", [" //\n" * 20000, " \n" * 100000])
def test_long_trailing_blanks_and_comments_parse_in_linear_time(tail: str) -> None:
    """Found by the fuzz tests: the lexer retried a failed match at every trailing blank (minutes)."""
    graph = pesto_ir.parse("graph @g() {\n}\n" + tail)
    assert graph.name == "g"


# ---------------------------------------------------------------- 8. output errors name the output

def test_a_failed_write_names_the_output_not_its_temporary_file(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.pir"

    real_open = os.open

    def refuse(path: Any, flags: int, *args: Any) -> Any:
        if flags & os.O_CREAT:  # the temporary file
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr("os.open", refuse)
    with pytest.raises(PermissionError) as e:
        write_atomic(target, "text")
    assert e.value.filename == str(target) and ".tmp" not in str(e.value)
    monkeypatch.undo()

    def no_rename(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device", src, dst)

    monkeypatch.setattr("os.replace", no_rename)
    with pytest.raises(OSError) as e:
        write_atomic(target, "text")
    assert e.value.filename == str(target) and e.value.filename2 is None
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too


def test_writing_through_a_link_or_into_a_device_keeps_them(tmp_path: Path) -> None:
    """`-o link.pir` writes the file the link points to; `-o /dev/null` and a FIFO are written in
    place (the atomic rename used to replace the device node or pipe with a plain file)."""
    import os
    import stat
    import threading

    real, link = tmp_path / "real.pir", tmp_path / "link.pir"
    real.write_text("old")
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    write_atomic(os.devnull, "discarded")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, "through the pipe")
    reader.join(timeout=10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("stride", [0, -1])
def test_a_slice_stride_below_one_is_a_located_error(stride: int) -> None:
    """Found by the mutation test of the examples: a zero stride divided by zero in the slice rule."""
    text = f"""graph @g(%x: f32[4,8]) {{
  %y = slice(%x) {{start_indices = [0, 0], limit_indices = [4, 8], strides = [1, {stride}]}} : f32[4,8]
  return %y
}}
"""
    with pytest.raises(PestoError, match=r"strides must be at least 1") as e:
        pesto_ir.verify(pesto_ir.parse(text))
    assert ":2:" in str(e.value) and "op 'y'" in str(e.value)  # the line and the op


@pytest.mark.parametrize("attr, shown", [("length = -10", "-10"), ("length = 2.5", "2.5"), ("length = nan", "nan"),
                                         ('length = "x"', "'x'"), ("length = 1e308", "1e+308"),
                                         ("length = 10, trip_count = -5", "-5")])
def test_a_loop_count_is_a_whole_number_the_cost_models_can_multiply_by(attr: str, shown: str) -> None:
    """A scan of length -10 was costed -45 us and planned into a negative makespan, silently; NaN
    or a 400-digit count crashed the roofline."""
    text = f"""graph @s(%c: f32[8,8], %xs: f32[10,8,8]) {{
  %out, %ys = scan(%c, %xs) {{{attr}, jaxpr = graph @body(%h: f32[8,8], %x: f32[8,8]) {{
        %m = dot_general(%h, %x) {{dimension_numbers = [[[1], [0]], [[], []]]}} : f32[8,8]
        return %m, %m
      }}}} : f32[8,8], f32[10,8,8]
  return %out
}}
"""
    key = "trip_count" if "trip_count" in attr else "length"
    with pytest.raises(PestoError, match=f"loop.pir:2:15: error: op 'out': scan: {key} must be a whole number "
                                         f"from 0 to 1000000000, not {re.escape(shown)}"):
        pesto_ir.verify(pesto_ir.parse(text, "loop.pir"))


@pytest.mark.parametrize("line, message", [
    ('%"\\ud800" = neg(%x) : f32[4,4]', r'escapes a lone surrogate \(\\ud800-\\udfff\), which is not text'),
    ('%y = neg(%x) {s = "\\udfff"} : f32[4,4]', r'escapes a lone surrogate'),
    ('%y = neg(%x) : f32[4,4] loc("a.py":' + "9" * 5000 + ":1)", "has more digits than a line or column number"),
    ("%y = neg(%x) {memory = 1" + "0" * 400 + ".5TiB} : f32[4,4]", "is more bytes than can be read"),
])
def test_text_that_cannot_be_written_back_or_read_as_a_number_is_a_located_error(line: str, message: str) -> None:
    """A lone surrogate parsed and then crashed every output; a 5000-digit line number and a
    400-digit size crashed the reader (ValueError, OverflowError)."""
    text = "graph @g(%x: f32[4,4]) {\n  " + line + "\n  return %" + ("y" if "%y" in line else '"\\ud800"') + "\n}\n"
    for engine in ("fast", "lark"):
        with pytest.raises(ParseError, match=r"^t.pir:2:\d+: .*" + message):
            pesto_ir.parse(text, "t.pir", engine=engine)


def test_a_json_string_escaping_a_lone_surrogate_is_refused_where_it_is() -> None:
    text = '{"format": "pesto-graph/1", "nodes": [{"id": "\\ud800", "cost": 1}], "edges": []}'
    with pytest.raises(ParseError, match=r"^g.json:1:\d+: a string escapes a lone surrogate"):
        parse_json_graph(text, "g.json")


def test_a_json_number_too_long_to_read_is_located_without_python_advice() -> None:
    """It said `invalid JSON: Exceeds the limit ... use sys.set_int_max_str_digits()` at 1:1."""
    text = '{"format": "pesto-graph/1", "nodes": [{"id": "a", "cost": ' + "1" * 5000 + '}], "edges": []}'
    with pytest.raises(ParseError) as e:
        parse_json_graph(text, "g.json")
    assert str(e.value) == "g.json:1:59: a number has more digits than can be read (4300 at most)"


@pytest.mark.parametrize("value, shown", [("[1]", "[1]"), ("5", "5")])
def test_colocate_is_a_group_name(value: str, shown: str) -> None:
    """`colocate = [1]` passed the verifier and was planned as if it were a name (the JSON reader
    refuses it)."""
    text = f"graph @g(%x: f32[4,4]) {{\n  %y = neg(%x) {{colocate = {value}}} : f32[4,4]\n  return %y\n}}\n"
    with pytest.raises(PestoError, match=re.escape(f"t.pir:2:8: error: op 'y': colocate must be a group name in "
                                                   f'quotes (colocate = "g1"), not {shown}')):
        pesto_ir.verify(pesto_ir.parse(text, "t.pir"))


@pytest.mark.parametrize("op, message", [
    ("scan(%x) {length = 3, jaxpr = 5}", "scan: jaxpr must be a graph, not 5"),
    ("cond(%x) {branches = []}", "cond: branches must be a graph or a non-empty list of graphs, not []"),
    ('while(%x) {body_jaxpr = "b"}', 'while: body_jaxpr must be a graph, not "b"'),
    ("scan(%x) {length = 3}", "scan holds no nested graph to run (e.g. jaxpr = graph @body(...) {...})"),
    ("cond(%x) {}", "cond holds no nested graph to run (e.g. branches = [graph @b0(...) {...}])"),
])
def test_a_structured_op_holds_the_graphs_it_runs(op: str, message: str) -> None:
    """A scan with `jaxpr = 5` and a cond with no branches passed the verifier and were costed and
    planned as plain ops."""
    text = f"graph @g(%x: f32[4]) {{\n  %y = {op} : f32[4]\n  return %y\n}}\n"
    with pytest.raises(PestoError, match=re.escape(f"t.pir:2:8: error: op 'y': {message}")):
        pesto_ir.verify(pesto_ir.parse(text, "t.pir"))


@pytest.mark.parametrize("op, message", [
    ("concatenate(%x, %x) {dimension = 9} : f32[8,4]",
     "concatenate: an axis or index in its attributes is out of range for operands of types f32[4,4], f32[4,4] "
     "(dimension = 9)"),
    ('reduce_sum(%x) {axes = "a"} : f32[]',
     'reduce_sum: its attributes have the wrong type or form for operands of types f32[4,4] (axes = "a")'),
])
def test_attributes_a_shape_rule_cannot_read_are_named_not_python_s_words(op: str, message: str) -> None:
    """They were "malformed attributes (tuple index out of range)" and "('<=' not supported between
    instances of 'int' and 'str')"."""
    text = f"graph @g(%x: f32[4,4]) {{\n  %y = {op}\n  return %y\n}}\n"
    with pytest.raises(PestoError, match=re.escape(f"t.pir:2:8: error: op 'y': {message}")):
        pesto_ir.verify(pesto_ir.parse(text, "t.pir"))
