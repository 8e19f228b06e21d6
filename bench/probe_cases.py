"""The bad-input probes of `bench/probe_inputs.py`, one function per kind: CLI flags, output
paths, file-system edges, pass pipelines, .pir files, JSON graphs, cluster files, device kinds, the
Python API and interrupts.

Only the lists of probes are here (`all_probes` gathers them); the records and helpers they are
written with are in `bench/probe_records.py`, and running and reporting them in
`bench/probe_inputs.py`. Kept apart so that each file stays short.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

from bench.probe_records import (
    FAST,
    GRAPH_DOC,
    MLP,
    OUT,
    ROOT,
    TANH,
    Probe,
    api,
    cli,
    cluster_json,
    either,
    graph_json,
    mlp_with,
    node_json,
    one_op,
    output_has,
    reads_back,
    stderr_has,
)


def flag_probes() -> list[Probe]:
    k = "CLI flags"
    bad = [("--devices", v) for v in ("0", "-1", "nan", "2.5", "", "lots", "1e3")] + \
          [("--memory", v) for v in ("nan", "0", "-1", "lots", "1e400", "-inf", "16 furlongs", "0.5")] + \
          [("--time-limit", v) for v in ("nan", "-1", "inf", "0", "1e999", "soon", "-inf")] + \
          [("--algo", v) for v in ("turbo", "", "ILP ")] + \
          [("--seed", v) for v in ("nan", "1.5")] + \
          [("--device-kind", v) for v in ("tpu9", "")] + \
          [("--emit", "rust")] + \
          [("--data-parallel", v) for v in ("0", "-1", "lots", "nan")] + \
          [("--microbatches", v) for v in ("0", "2.5", "")]
    probes = [cli(f"{flag} {value!r}", k, ["{mlp}", f"{flag}={value}", *(["-q"] if flag == "--algo" else FAST), *OUT],
                  "error") for flag, value in bad]
    probes += [
        cli("--devices 100000", k, ["{mlp}", "--devices", "100000", "-q", *OUT], "any"),
        cli("--devices 100000 (m-etf)", k, ["{mlp}", "--devices", "100000", *FAST, *OUT], "any"),
        cli("--memory 1 (nothing fits)", k, ["{mlp}", "--memory", "1", *FAST, *OUT], "error"),
        cli("--memory 16GiB", k, ["{mlp}", "--memory", "16GiB", *FAST, *OUT], "ok", check=reads_back("out.pir")),
        cli("--time-limit 0.5", k, ["{mlp}", "--time-limit", "0.5", "--algo", "cpsat", "-q", *OUT], "ok"),
        cli("--seed 10**30", k, ["{mlp}", "--seed", "1" + "0" * 30, *FAST, *OUT], "any"),
        cli("--cluster with --devices", k, ["{mlp}", "--cluster", "{dir}/c.json", "--devices", "2", *FAST],
            "error", files={"c.json": cluster_json()}),
        cli("--gantt-memory without --gantt", k, ["{mlp}", "--gantt-memory", *FAST, *OUT], "error"),
        cli("--data-parallel 2 without place", k, ["{mlp}", "-p", "annotate-costs,simulate",
                                                   "--data-parallel", "2", "-q", *OUT], "error"),
        cli("unknown flag --turbo", k, ["{mlp}", "--turbo", *FAST, *OUT], "error"),
        cli("no model argument", k, [*FAST], "error"),
        cli("missing model file", k, ["{dir}/nope.pir", *FAST, *OUT], "error"),
        cli("model is a folder", k, ["{dir}", *FAST, *OUT], "error"),
        cli("--microbatches 1024 (batch 64)", k, ["{mlp}", "--microbatches", "1024", "--devices", "2", "-q", *OUT],
            "error"),
        cli("--microbatches 3 (batch 64)", k, ["{mlp}", "--microbatches", "3", "--devices", "2", *FAST, *OUT], "any"),
        cli("--data-parallel 4 on 2 devices", k, ["{mlp}", "--data-parallel", "4", "--devices", "2", *FAST, *OUT],
            "error"),
        cli("--time-limit 1e-9", k, ["{mlp}", "--time-limit", "1e-9", "-q", *OUT], "any"),
        cli("--seed -1", k, ["{mlp}", "--seed", "-1", *FAST, *OUT], "any"),
        cli("model '-' (stdin)", k, ["-", *FAST, *OUT], "any"),
        cli("--emit python of a cost graph", k, ["{msr}", *FAST, "--emit", "python", "-o", "{dir}/m.py"], "error"),
        cli("the quick start (default algo)", k, ["{mlp}", "-q", *OUT], "ok", check=reads_back("out.pir")),
        cli("MSR graph, ilp 2 s", k, ["{msr}", "--algo", "ilp", "--time-limit", "2", "-q", *OUT], "ok",
            check=reads_back("out.pir")),
    ]
    return probes


def output_probes() -> list[Probe]:
    k = "output paths"
    return [
        cli("-o the input", k, ["{mlp}", *FAST, "-o", "{mlp}"], "error"),
        cli("-o the input via ..", k, ["{mlp}", *FAST, "-o", "{dir}/sub/../mlp.pir"], "error",
            files={"sub/keep": ""}),
        cli("-o the input through a symlink", k, ["{mlp}", *FAST, "-o", "{dir}/link.pir"], "error",
            files={"link.pir": "->mlp.pir"}),
        cli("-o the --cluster file", k, ["{mlp}", "--cluster", "{dir}/c.json", *FAST, "-o", "{dir}/c.json"],
            "error", files={"c.json": cluster_json()}),
        cli("-o equal to --plan-json", k, ["{mlp}", *FAST, "-o", "{dir}/x", "--plan-json", "{dir}/x"], "error"),
        cli("--trace equal to --gantt", k, ["{mlp}", *FAST, "--trace", "{dir}/x.png", "--gantt", "{dir}/x.png"],
            "error"),
        cli("-o and --plan-json both stdout", k, ["{mlp}", *FAST, "-o", "-", "--plan-json", "-"], "error"),
        cli("-o in a missing folder", k, ["{mlp}", *FAST, "-o", "{dir}/missing/out.pir"], "error"),
        cli("-o is a folder", k, ["{mlp}", *FAST, "-o", "{dir}"], "error"),
        cli("-o where no file can be made (/proc)", k, ["{mlp}", *FAST, "-o", "/proc/pesto-out.pir"], "error"),
        cli("--gantt with a bad extension", k, ["{mlp}", *FAST, *OUT, "--gantt", "{dir}/g.txt"], "error"),
        cli("--plan-json without a plan", k, ["{mlp}", "-p", "annotate-costs", "-q", *OUT,
                                              "--plan-json", "{dir}/p.json"], "error"),
        cli("--memory-plot without a plan", k, ["{mlp}", "-p", "annotate-costs", "-q", *OUT,
                                                "--memory-plot", "{dir}/m.png"], "error"),
        cli("--emit python without a plan", k, ["{mlp}", "-p", "annotate-costs", "-q", "--emit", "python",
                                                "-o", "{dir}/m.py"], "error"),
        cli("--memory-plot .jpg", k, ["{mlp}", *FAST, *OUT, "--memory-plot", "{dir}/m.jpg"], "error"),
        cli("-o ending in a slash", k, ["{mlp}", *FAST, "-o", "{dir}/new/"], "error"),
        cli("all outputs at once", k, ["{mlp}", *FAST, *OUT, "--plan-json", "{dir}/p.json", "--trace",
                                       "{dir}/t.json", "--gantt", "{dir}/g.png", "--memory-plot", "{dir}/m.svg"],
            "ok"),
    ]


def filesystem_probes() -> list[Probe]:
    """Paths that name no file to read or write (issue 45): symbolic link loops, /dev/zero, FIFOs
    nobody writes or reads, a path under a regular file, a dangling link, stdout closed or full.
    Each is quick when handled: the short timeouts keep a hang from holding up the prober."""
    k = "file-system edges"
    loop = {"loop.pir": "->loop.pir"}
    start = "->RUN:{mlp} --algo m-etf -q --plan-json {dir}/start.json"  # a real plan, for --start probes
    probes = [
        cli("model a symlink loop", k, ["{dir}/loop.pir", *FAST, *OUT], "error", files=loop),
        cli("model a two-link symlink loop", k, ["{dir}/a.pir", *FAST, *OUT], "error",
            files={"a.pir": "->b.pir", "b.pir": "->a.pir"}),
        cli("--cluster a symlink loop", k, ["{mlp}", "--cluster", "{dir}/loop.pir", *FAST, *OUT], "error", files=loop),
        cli("--start a symlink loop", k, ["{mlp}", "--start", "{dir}/loop.pir", *FAST, *OUT], "error", files=loop),
        cli("model /dev/zero", k, ["/dev/zero", *FAST, *OUT], "error", timeout=20),
        cli("--cluster /dev/zero", k, ["{mlp}", "--cluster", "/dev/zero", *FAST, *OUT], "error", timeout=20),
        cli("--start /dev/zero", k, ["{mlp}", "--start", "/dev/zero", *FAST, *OUT], "error", timeout=20),
        cli("model a FIFO nobody writes", k, ["{dir}/m.pir", *FAST, *OUT], "error", files={"m.pir": "->FIFO"},
            timeout=10),
        cli("--cluster a FIFO nobody writes", k, ["{mlp}", "--cluster", "{dir}/c.json", *FAST, *OUT], "error",
            files={"c.json": "->FIFO"}, timeout=10),
        cli("--start a FIFO nobody writes", k, ["{mlp}", "--start", "{dir}/p.json", *FAST, *OUT], "error",
            files={"p.json": "->FIFO"}, timeout=10),
        cli("--start a real plan (control)", k, ["{mlp}", "--start", "{dir}/start.json", *FAST, *OUT], "ok",
            files={"start.json": start}, check=reads_back("out.pir")),
        cli("-o - with stdout closed", k, ["{mlp}", *FAST, "-o", "-"], "error", stdout="closed", says="stdout"),
        cli("--plan-json - with stdout closed", k, ["{mlp}", *FAST, *OUT, "--plan-json", "-"], "error",
            stdout="closed", says="stdout"),
        cli("-o - with stdout /dev/full", k, ["{mlp}", *FAST, "-o", "-"], "error", stdout="/dev/full",
            says="stdout"),
        cli("--plan-json - with stdout /dev/full", k, ["{mlp}", *FAST, *OUT, "--plan-json", "-"], "error",
            stdout="/dev/full", says="stdout"),
        cli("-o under a regular file", k, ["{mlp}", *FAST, "-o", "{dir}/file.pir/out.pir"], "error",
            files={"file.pir": "not a folder"}, says="file.pir' is a file"),
        cli("-o a dangling symlink into a missing folder", k, ["{mlp}", *FAST, "-o", "{dir}/out/link.pir"], "error",
            files={"out/link.pir": "->missing/x.pir"}, says="symbolic link"),
        cli("-o a dangling symlink into a missing folder, with other outputs", k,
            ["{mlp}", *FAST, "--plan-json", "{dir}/p.json", "--trace", "{dir}/t.json", "-o", "{dir}/out/link.pir"],
            "error", files={"out/link.pir": "->missing/x.pir"}, says="symbolic link"),
        cli("-o a symlink loop", k, ["{mlp}", *FAST, "-o", "{dir}/loop.pir"], "error", files=loop,
            says="symbolic link loop"),
        cli("--plan-json a FIFO nobody reads", k, ["{mlp}", *FAST, *OUT, "--plan-json", "{dir}/p.json"], "error",
            files={"p.json": "->FIFO"}, timeout=20),
        cli("-o /dev/null (control)", k, ["{mlp}", *FAST, "-o", "/dev/null"], "ok"),
    ]
    return probes


def fanout_probes() -> list[Probe]:
    """One op read by 1,000 others and 1,000 read by one (issue 45: 1 -> 1,000 took 38 s with m-etf;
    the bench of `bench/` times 1k-50k nodes). Generous timeouts: a probe, not a benchmark."""
    k = "high fan-out"

    def star(n: int, reverse: bool) -> Callable[[], str]:
        def make() -> str:
            nodes = [{"id": "hub", "cost": 0.001}, *({"id": f"n{i}", "cost": 0.001} for i in range(n))]
            edges = [{"src": f"n{i}", "dst": "hub", "bytes": 1024} if reverse else
                     {"src": "hub", "dst": f"n{i}", "bytes": 1024} for i in range(n)]
            return json.dumps({"format": "pesto-graph/1", "name": "star", "nodes": nodes, "edges": edges})
        return make

    probes = []
    for shape, reverse in (("1 -> 1,000 star", False), ("1,000 -> 1 reverse star", True)):
        for engine in (["--algo", "m-etf"], ["--time-limit", "5"]):
            name = f"{shape}, {'m-etf' if engine[0] == '--algo' else 'the default engine (5 s)'}, 4 devices"
            probes.append(cli(name, k, ["{dir}/g.json", *engine, "--devices", "4", "-q", *OUT], "ok",
                              files={"g.json": star(1000, reverse)}, check=reads_back("out.pir"), timeout=90))
    return probes


def pipeline_probes() -> list[Probe]:
    k = "pass pipeline"
    bad = ["", "   ", ",", "verify,,simulate", "place{algo=ilp algo=m-etf}", "annotate-costs,place{seed=1 seed=2}",
           "turbo", "place{turbo=1}", "place{time-limit=nan}", "place{time-limit=-1}", "place{time-limit=inf}",
           "place{seed=x}", "place{solver=turbo}", "annotate-costs,place{", "annotate-costs,place}",
           "coarsen{target=0}", "coarsen{target=-5}", "coarsen{target=nan}", "coarsen{colocation=turbo}",
           "annotate-costs{model=turbo}", "annotate-costs{runs=0}", "annotate-costs{runs=-1}",
           "annotate-costs{stat=turbo}", "annotate-costs{clock=turbo}", "annotate-costs{cache=maybe}",
           "microbatch{microbatches=0}", "microbatch{data-parallel=-2}", "place{data-parallel=0}",
           "place{microbatches=lots}", "plåce", "place{algo=m-etf}" + "x" * 100_000]
    probes = [cli(f"-p {text[:40]!r}" + (f" ({len(text)} chars)" if len(text) > 40 else ""), k,
                  ["{mlp}", "-p", text, "--devices", "2", "-q", *OUT], "error") for text in bad]
    probes += [
        cli("place without costs", k, ["{mlp}", "-p", "place{algo=m-etf},simulate", "-q", *OUT], "error"),
        cli("simulate without a plan", k, ["{mlp}", "-p", "annotate-costs,simulate", "--devices", "2", "-q",
                                           *OUT], "any"),
        cli("expand without place", k, ["{mlp}", "-p", "annotate-costs,expand", "-q", *OUT], "any"),
        cli("place twice", k, ["{mlp}", "-p", "annotate-costs,place{algo=m-etf},place{algo=m-etf},simulate",
                               "-q", *OUT], "any"),
        cli("time-limit=0.2 in the pipeline", k, ["{msr}", "-p", "place{algo=ilp time-limit=0.2},simulate", "-q",
                                                  *OUT], "ok", check=reads_back("out.pir")),
    ]
    return probes


def pir_probes() -> list[Probe]:
    k = ".pir files"
    half = lambda: MLP.read_text()[:len(MLP.read_text()) // 2]  # noqa: E731
    bad: dict[str, str | bytes | Callable[[], str | bytes]] = {
        "unterminated graph": "graph @g() {\n  %x = opaque() {cost = 1ms} : blob[4]\n",
        "truncated example": half,
        "empty file": "",
        "only a comment": "// nothing here\n",
        "list nested 5000 deep": "graph @g() attributes {a = " + "[" * 5000 + "]" * 5000 + "} {}\n",
        "graphs nested 5000 deep": lambda: "graph @g() {\n" + "  @o noop() {body = graph @h() {\n" * 5000,
        "cost 10**400": one_op("cost = 1" + "0" * 400),
        "cost 1e400": one_op("cost = 1e400"),
        "cost nan": one_op("cost = nan"),
        "cost inf ms": one_op("cost = infms"),
        "cost -1ms": one_op("cost = -1ms"),
        "cost a string": one_op('cost = "fast"'),
        "memory nan": one_op("cost = 1ms, memory = nan"),
        "memory 2.5 bytes": one_op("cost = 1ms, memory = 2.5"),
        "memory 10**400": one_op("cost = 1ms, memory = 1" + "0" * 400),
        "user device attribute": mlp_with("%h = add(%h_mm, %b1_row)", "%h = add(%h_mm, %b1_row) {device = @gpu1}"),
        "device on a missing device": mlp_with("%h = add(%h_mm, %b1_row)",
                                               "%h = add(%h_mm, %b1_row) {device = @tpu7}"),
        "duplicate value name": "graph @g() {\n  %x = opaque() {cost = 1ms} : blob[4]\n"
                                "  %x = opaque() {cost = 1ms} : blob[4]\n}\n",
        "undefined operand": "graph @g() {\n  %x = opaque(%nope) {cost = 1ms} : blob[4]\n}\n",
        "shape mismatch": mlp_with("%h = add(%h_mm, %b1_row) : f32[64,256]", "%h = add(%h_mm, %b1_row) : f32[64,255]"),
        "negative dimension": TANH.replace("f32[4]", "f32[-4]"),
        "unknown dtype": TANH.replace("f32[4]", "f33[4]"),
        "dimension 10**30": TANH.replace("f32[4]", "f32[1" + "0" * 30 + "]"),
        "NUL byte": "graph @g() {\x00}\n",
        "not UTF-8": b"graph @g() {\n  // \xff\xfe\n}\n",
        "invalid string escape": one_op('cost = 1ms, note = "bad\\q"'),
        "5 MB junk line": lambda: "graph @g() {\n  %a = opaque() {note = " + "x" * 5_000_000 + "} : blob[4]\n}\n",
        "5 MB of '['": lambda: "[" * 5_000_000,
        "JSON in a .pir": graph_json(),
        "two returns": "graph @g(%x: f32[4]) {\n  return %x\n  return %x\n}\n",
    }
    probes = [cli(name, k, ["{dir}/m.pir", *FAST, *OUT], "error", files={"m.pir": text})
              for name, text in bad.items()]
    probes += [
        cli("unknown opcode (warned)", k, ["{dir}/m.pir", "--algo", "m-etf", *OUT], "ok",
            files={"m.pir": TANH.replace("tanh", "frobnicate")}, check=stderr_has("warning")),
        cli("user memory attribute kept", k, ["{dir}/m.pir", *FAST, *OUT], "ok",
            files={"m.pir": TANH.replace("tanh(%x)", "tanh(%x) {memory = 4MiB}")},
            check=output_has("out.pir", "memory = 4MiB")),
        cli("user cost kept (model=given)", k, ["{dir}/m.pir", "-p", "annotate-costs{model=given},place{algo=m-etf}",
                                                "-q", *OUT], "ok",
            files={"m.pir": TANH.replace("tanh(%x)", "tanh(%x) {cost = 7ms}")},
            check=output_has("out.pir", "cost = 7ms")),
        cli("one op's own cost (model=auto): kept or warned", k, ["{mlp}", "--algo", "m-etf", *OUT], "ok",
            files={"mlp.pir": mlp_with("%h = add(%h_mm, %b1_row)", "%h = add(%h_mm, %b1_row) {cost = 7ms}")},
            check=either(output_has("out.pir", "cost = 7ms"), stderr_has("warning"))),
        cli("user colocate kept", k, ["{mlp}", *FAST, *OUT], "ok",
            files={"mlp.pir": mlp_with("%h = add(%h_mm, %b1_row)", '%h = add(%h_mm, %b1_row) {colocate = "mine"}')},
            check=output_has("out.pir", 'colocate = "mine"')),
        cli("cost for another kind only", k, ["{dir}/m.pir", "-p", "annotate-costs{model=given},place{algo=m-etf}",
                                              "--device-kind", "v100", "-q", *OUT], "error",
            files={"m.pir": TANH.replace("tanh(%x)", "tanh(%x) {cost = {h100 = 1ms}}")}),
        cli("cost for another kind only (model=auto)", k, ["{dir}/m.pir", "--device-kind", "v100", *FAST, *OUT],
            "any", files={"m.pir": TANH.replace("tanh(%x)", "tanh(%x) {cost = {h100 = 1ms}}")}),
        cli("cost 1e-400 (rounds to 0)", k, ["{dir}/m.pir", *FAST, *OUT], "any", files={"m.pir": one_op("cost = 1e-400")}),
        cli("colocate a number", k, ["{dir}/m.pir", *FAST, *OUT], "any", files={"m.pir": one_op("cost = 1ms, colocate = 5")}),
        cli("no ops", k, ["{dir}/m.pir", *FAST, *OUT], "any", files={"m.pir": "graph @g(%x: f32[4]) {\n  return %x\n}\n"}),
        cli("trailing comma in a shape", k, ["{dir}/m.pir", *FAST, *OUT], "error",
            files={"m.pir": TANH.replace("f32[4]", "f32[4,]")}),
        cli("byte-order mark", k, ["{dir}/m.pir", *FAST, *OUT], "any", files={"m.pir": "\ufeff" + TANH}),
        cli("CRLF line ends", k, ["{dir}/m.pir", *FAST, *OUT], "ok", files={"m.pir": TANH.replace("\n", "\r\n")}),
        cli("re-place a placed graph", k, ["{dir}/placed.pir", *FAST, *OUT], "ok",
            files={"placed.pir": "->RUN:{mlp} --algo m-etf -q -o {dir}/placed.pir"}),
    ]
    return probes


def json_probes() -> list[Probe]:
    k = "JSON graphs"
    bad: dict[str, str | Callable[[], str]] = {
        "not JSON": '{"format": "pesto-graph/1",\n "nodes": [}\n',
        "a list at the top": "[1, 2]",
        "no format": json.dumps({"nodes": []}),
        "format pesto-graph/2": graph_json(format="pesto-graph/2"),
        "nodes not a list": graph_json(nodes="abc"),  # type: ignore[arg-type]
        "node cost a string": node_json(cost="fast"),
        "node cost NaN": node_json(cost=float("nan")),
        "node cost 10**400": graph_json().replace("0.002", "1" + "0" * 400),
        "node cost negative": node_json(cost=-1),
        "node cost per kind inf": node_json(cost={"h100": float("inf")}),
        "node memory 2.5": node_json(memory=2.5),
        "node memory a list": node_json(memory=[1]),
        "node id a list": node_json(id=["a"]),
        "duplicate node ids": graph_json(nodes=[{"id": "a", "cost": 1}, {"id": "a", "cost": 1}]),
        "edge to a missing node": graph_json(edges=[{"src": "a", "dst": "zz"}]),
        "self-loop edge": graph_json(edges=[{"src": "a", "dst": "a"}]),
        "cycle a->b->a": graph_json(edges=[{"src": "a", "dst": "b"}, {"src": "b", "dst": "a"}]),
        "edge bytes -1": graph_json(edges=[{"src": "a", "dst": "b", "bytes": -1}]),
        "edge bytes 'big'": graph_json(edges=[{"src": "a", "dst": "b", "bytes": "big"}]),
        "100k-deep nesting": lambda: '{"format": "pesto-graph/1", "nodes": [],\n "x": ' + "[" * 100_000
                                     + "]" * 100_000 + "}",
        'suggested_cluster "lots"': graph_json(suggested_cluster="lots"),
        "suggested_cluster devices 0": graph_json(suggested_cluster={"devices": 0}),
        "suggested_cluster memory NaN": graph_json(suggested_cluster={"memory": float("nan")}),
        'colocate ["x"]': node_json(colocate=["x"]),
        "colocate true": node_json(colocate=True),
        "per_sample 'no'": node_json(per_sample="no"),
        "param_bytes -5": node_json(param_bytes=-5),
        "backward 1.5": node_json(backward=1.5),
        "5 MB junk line": lambda: '{"format": "pesto-graph/1", "nodes": [' + "x" * 5_000_000 + "]}",
        "a .pir in a .json": TANH,
    }
    probes = [cli(name, k, ["{dir}/g.json", *FAST, *OUT], "error", files={"g.json": text})
              for name, text in bad.items()]
    probes += [
        cli("cost only for another kind", k, ["{dir}/g.json", *FAST, *OUT], "error",
            files={"g.json": graph_json(nodes=[{"id": "a", "cost": {"tpu": 0.001}}, {"id": "b", "cost": 0.001},
                                               {"id": "c", "cost": 0.001}])}),
        cli("suggested_cluster devices 100000", k, ["{dir}/g.json", *FAST, *OUT], "error",
            files={"g.json": graph_json(suggested_cluster={"devices": 100000})}),
        cli("suggested_cluster memory 1 byte", k, ["{dir}/g.json", *FAST, *OUT], "error",
            files={"g.json": graph_json(suggested_cluster={"memory": 1})}),
        cli("no costs at all", k, ["{dir}/g.json", *FAST, *OUT], "error",
            files={"g.json": graph_json(nodes=[{"id": "a"}, {"id": "b"}, {"id": "c"}])}),
        cli("no nodes", k, ["{dir}/g.json", *FAST, *OUT], "any", files={"g.json": graph_json(nodes=[], edges=[])}),
        cli("a valid toy graph", k, ["{dir}/g.json", *FAST, *OUT], "ok", files={"g.json": graph_json()},
            check=reads_back("out.pir")),
        cli("colocate 3 (a number)", k, ["{dir}/g.json", *FAST, *OUT], "ok", files={"g.json": node_json(colocate=3)},
            check=output_has("out.pir", 'colocate = "3"')),
        cli("NaN link latency with ilp", k, ["{msr}", "--cluster", "{dir}/c.json", "--algo", "ilp",
                                              "--time-limit", "2", "-q", *OUT], "error",
            files={"c.json": cluster_json(link={"latency": float("nan"), "bandwidth": 1e10})}),
    ]
    return probes


def cluster_probes() -> list[Probe]:
    k = "cluster files"
    two = [{"name": "g0", "kind": "h100"}, {"name": "g1", "kind": "h100"}]
    bad: dict[str, str] = {
        "duplicate device names": cluster_json([{"name": "g0", "kind": "h100"}, {"name": "g0", "kind": "h100"}]),
        "negative bandwidth": cluster_json(link={"bandwidth": -1}),
        "zero bandwidth on a link": cluster_json(links=[{"src": "g0", "dst": "g1", "bandwidth": 0}]),
        "NaN latency": cluster_json(link={"latency": float("nan")}),
        "infinite latency": cluster_json(links=[{"src": "g0", "dst": "g1", "latency": float("inf")}]),
        "no devices": cluster_json([]),
        "devices not a list": cluster_json("g0,g1"),  # type: ignore[arg-type]
        "device memory 'lots'": cluster_json([{**two[0], "memory": "lots"}, two[1]]),
        "device memory 0": cluster_json([{**two[0], "memory": 0}, two[1]]),
        "peak_flops -1": cluster_json([{**two[0], "peak_flops": -1}, two[1]]),
        "peak_flops NaN": cluster_json([{**two[0], "peak_flops": float("nan")}, two[1]]),
        "device without a name": cluster_json([{"kind": "h100"}, two[1]]),
        "link from a device to itself": cluster_json(links=[{"src": "g0", "dst": "g0"}]),
        "link to a missing device": cluster_json(links=[{"src": "g0", "dst": "g9"}]),
        "format pesto-cluster/9": cluster_json(format="pesto-cluster/9"),
        "not JSON": "{devices: [}",
        "custom kind without memory": cluster_json([{"name": "x0", "kind": "npu"}, {"name": "x1", "kind": "npu"}]),
        "custom kind, roofline needed": cluster_json([{"name": "x0", "kind": "npu", "memory": 1e10},
                                                      {"name": "x1", "kind": "npu", "memory": 1e10}]),
    }
    probes = [cli(name, k, ["{mlp}", "--cluster", "{dir}/c.json", *FAST, *OUT], "error", files={"c.json": text})
              for name, text in bad.items()]
    probes += [
        cli("1000 devices", k, ["{mlp}", "--cluster", "{dir}/c.json", *FAST, *OUT], "error",
            files={"c.json": cluster_json([{"name": f"g{i}", "kind": "h100"} for i in range(1000)])}),
        cli("memory Infinity", k, ["{mlp}", "--cluster", "{dir}/c.json", *FAST, *OUT], "any",
            files={"c.json": cluster_json([{"name": "g0", "kind": "h100", "memory": float("inf")}])}),
        cli("device kind a number", k, ["{mlp}", "--cluster", "{dir}/c.json", *FAST, *OUT], "error",
            files={"c.json": cluster_json([{"name": "g0", "kind": 7}])}),
        cli("missing cluster file", k, ["{mlp}", "--cluster", "{dir}/nope.json", *FAST, *OUT], "error"),
        cli("one device", k, ["{mlp}", "--cluster", "{dir}/c.json", *FAST, *OUT], "ok",
            files={"c.json": cluster_json(two[:1])}),
        cli("custom kind, costs given per kind", k, ["{dir}/g.json", "--cluster", "{dir}/c.json", *FAST, *OUT], "ok",
            files={"c.json": cluster_json([{"name": "x0", "kind": "npu", "memory": 1e10},
                                           {"name": "x1", "kind": "npu", "memory": 1e10}]),
                   "g.json": graph_json(nodes=[{"id": "a", "cost": {"npu": 0.001}}, {"id": "b", "cost": {"npu": 0.002}},
                                               {"id": "c", "cost": {"npu": 0.003}}])}),
        cli("--memory over a cluster file", k, ["{mlp}", "--cluster", "{dir}/c.json", "--memory", "1GiB", *FAST,
                                                *OUT], "ok", files={"c.json": cluster_json()}),
    ]
    return probes


def kind_probes() -> list[Probe]:
    """Device kinds are one name whatever their case (issue 45): costs keyed "H100" on h100
    devices, and the other way round, are accepted."""
    k = "device kinds"
    upper = {"a": {"H100": 0.002}, "b": {"H100": 0.003}, "c": {"H100": 0.001}}
    lower = {n: {"h100": t["H100"]} for n, t in upper.items()}

    def costs(by_node: dict[str, dict[str, float]]) -> str:
        return graph_json(nodes=[{**n, "cost": by_node[n["id"]]} for n in GRAPH_DOC["nodes"]])

    return [
        cli("costs keyed H100, --device-kind h100", k, ["{dir}/g.json", "--devices", "2", "--device-kind", "h100",
                                                        *FAST, *OUT], "ok",
            files={"g.json": costs(upper)}, check=reads_back("out.pir")),
        cli("costs keyed h100, cluster kind H100", k, ["{dir}/g.json", "--cluster", "{dir}/c.json", *FAST, *OUT], "ok",
            files={"g.json": costs(lower), "c.json": cluster_json([{"name": "g0", "kind": "H100"},
                                                                   {"name": "g1", "kind": "H100"}])},
            check=reads_back("out.pir")),
        cli("costs keyed H100, cluster kind Npu (custom)", k, ["{dir}/g.json", "--cluster", "{dir}/c.json", *FAST,
                                                               *OUT], "ok",
            files={"g.json": costs({n: {"NPU": t["H100"]} for n, t in upper.items()}),
                   "c.json": cluster_json([{"name": "x0", "kind": "Npu", "memory": 1e10},
                                           {"name": "x1", "kind": "Npu", "memory": 1e10}])},
            check=reads_back("out.pir")),
        cli("--device-kind H100", k, ["{mlp}", "--device-kind", "H100", *FAST, *OUT], "ok", check=reads_back("out.pir")),
        cli(".pir cost {H100 = 1ms}, model=given", k, ["{dir}/m.pir", "-p", "annotate-costs{model=given},place{algo=m-etf}",
                                                       "--device-kind", "h100", "-q", *OUT], "ok",
            files={"m.pir": TANH.replace("tanh(%x)", "tanh(%x) {cost = {H100 = 1ms}}")},
            check=output_has("out.pir", "H100 = 1ms")),
    ]


def api_probes() -> list[Probe]:
    k = "Python API"
    entry = {
        "parse(None)": "pesto_ir.parse(None)",
        'parse(b"...")': 'pesto_ir.parse(b"graph @g() {}")',
        "parse(123)": "pesto_ir.parse(123)",
        "parse(text, None)": 'pesto_ir.parse("graph @g() {}", None)',
        'parse(text, engine="turbo")': 'pesto_ir.parse("graph @g() {}", engine="turbo")',
        "parse(unterminated)": 'pesto_ir.parse("graph @g() {")',
        "parse(5000-deep list), lark": 'pesto_ir.parse("graph @g() attributes {a = " + "[" * 5000 + "]" * 5000 '
                                       '+ "} {}", engine="lark")',
        "parse(5 MB junk)": 'pesto_ir.parse("z" * 5_000_000)',
        "load(None)": "pesto_ir.load(None)",
        "load(123)": "pesto_ir.load(123)",
        "load(missing file)": 'pesto_ir.load("/nonexistent/model.pir")',
        "load(a folder)": 'pesto_ir.load("/tmp")',
        "load(.txt file)": 'pesto_ir.load("m.txt")',
        "parse_json_graph(None)": "from pesto_ir.frontends.json_graph import parse_json_graph; parse_json_graph(None)",
        "Cluster.load(None)": "from pesto_ir.cluster.model import Cluster; Cluster.load(None)",
        "Cluster.homogeneous(0)": "from pesto_ir.cluster.model import Cluster; Cluster.homogeneous(0)",
        "Cluster.homogeneous(2, latency=nan)": "from pesto_ir.cluster.model import Cluster; "
                                               "Cluster.homogeneous(2, latency=float('nan'))",
        "Cluster.homogeneous(2, 'tpu9')": "from pesto_ir.cluster.model import Cluster; Cluster.homogeneous(2, 'tpu9')",
        'Pipeline.parse("")': "from pesto_ir.passmanager import Pipeline; Pipeline.parse('')",
        "Pipeline.parse(None)": "from pesto_ir.passmanager import Pipeline; Pipeline.parse(None)",
        "Cluster.homogeneous(100000)": "from pesto_ir.cluster.model import Cluster; Cluster.homogeneous(100000)",
        "Plan.from_json(junk)": "from pesto_ir.schedule.plan import Plan; Plan.from_json({'format': 'x'})",
    }
    probes = [api(name, k, "import pesto_ir\n" + code, "error", files={"m.txt": "hello"}) for name, code in entry.items()]
    par = {
        'devices=["gpu0"]': 'devices=["gpu0"]',
        "devices=4": "devices=4",
        'devices="cpu"': 'devices="cpu"',
        "devices=[]": "devices=[]",
        "devices={}": "devices={}",
        "data_parallel=0": "data_parallel=0",
        "data_parallel=-1": "data_parallel=-1",
        "data_parallel=2.5": "data_parallel=2.5",
        'data_parallel="lots"': 'data_parallel="lots"',
        "data_parallel=True": "data_parallel=True",
        "microbatches=0": "microbatches=0",
        'microbatches="x"': 'microbatches="x"',
        "autotune_steps=0": "autotune_steps=0",
        "autotune_steps=-1": "autotune_steps=-1",
        "autotune_steps=2.5": "autotune_steps=2.5",
        'autotune_steps="5"': 'autotune_steps="5"',
        'autotune="yes"': 'autotune="yes"',
        "time_limit=nan": 'time_limit=float("nan")',
        "time_limit=inf": 'time_limit=float("inf")',
        'algo="turbo"': 'algo="turbo"',
        'cost_model="turbo"': 'cost_model="turbo"',
        "seed=1.5": "seed=1.5",
        "param_argnums=(-1,)": "param_argnums=(-1,)",
        "param_argnums=(5,)": "param_argnums=(5,)",
        "batch_argnums=param_argnums": "batch_argnums=(0,), param_argnums=(0,)",
        "coarsen_target=0": "coarsen_target=0",
        'coarsen_target="x"': 'coarsen_target="x"',
        'cluster="h100"': 'cluster="h100"',
        'compiler_options="fast"': 'compiler_options="fast"',
        "data_parallel=4 on 2 devices": "data_parallel=4, devices=jax.devices()[:2]",
        "the same device twice": "devices=[jax.devices()[0]] * 2",
        "microbatches=3 (batch of 8)": "microbatches=3, devices=jax.devices()[:2]",
        "data_parallel=3 (batch of 8)": "data_parallel=3, devices=jax.devices()[:3]",
        "devices={0: device}": "devices={0: jax.devices()[0]}",
        "batch_argnums=(3,)": "batch_argnums=(3,)",
    }
    step = ("import jax, jax.numpy as jnp, pesto_ir\n"
            "def f(x): return jnp.sin(x) * 2\n"
            "options = dict(algo='m-etf', time_limit=2)\n"
            "options.update(dict({kwargs}))\n"
            "g = pesto_ir.parallelize(f, **options)\n"
            "x = jnp.arange(8.0)\n"
            "y = g(x)\n"
            "if not jnp.allclose(y, jax.jit(f)(x)): wrong('not jax.jit\\'s numbers')\n")
    probes += [api(f"parallelize({name})", k, step.replace("{kwargs}", kwargs), "error") for name, kwargs in par.items()]
    probes += [
        api("parallelize(123)", k, "import pesto_ir\npesto_ir.parallelize(123)", "error"),
        api("parallelize(f) on 2 devices", k, step.replace("{kwargs}", "devices=jax.devices()[:2]"), "ok"),
        api("parallelize(f) called with a str", k, step.replace("{kwargs}", "devices=jax.devices()[:2]")
            .replace("y = g(x)", "y = g('abc')"), "error", also_clear=("TypeError",)),  # jax.jit's own TypeError
        api("parse(valid example)", k, f"import pesto_ir\npesto_ir.verify(pesto_ir.load({str(MLP)!r}))", "ok"),
    ]
    return probes


def interrupt_probes() -> list[Probe]:
    """SIGINT 8 s into a solve that would take its whole 60 s (bert_l-3's training step in 150 groups
    on 4 devices): it must stop within 2 s and keep the best plan found so far. `auto` is probed
    placing one batch (its search would end in about 7 s here: a pipeline of 32 micro-batches needs
    no refinement) and 3 s into its hybrid search, while it screens the strategies."""
    k = "interrupts"
    big = ROOT / "graphs" / "msr" / "bert_l-3_training_op.json"
    probes = []
    runs = [("ilp", "ilp", "place,simulate", 8.0), ("cpsat", "cpsat", "place,simulate", 8.0),
            ("auto (one batch)", "auto", "place{data-parallel=1 microbatches=1},expand,simulate", 8.0),
            ("auto (hybrid search)", "auto", "place,expand,simulate", 3.0)]
    for what, algo, passes, after in runs:
        for group in (False, True):
            how = "Ctrl-C to the group" if group else "kill -INT pesto-compile"
            argv = [str(big), "--algo", algo, "--time-limit", "60", "--devices", "4",
                    "-p", f"coarsen{{target=150}},{passes}", *OUT]
            probes.append(cli(f"{how} during {what}", k, argv, "ok", interrupt_after=after, interrupt_group=group,
                              check=reads_back("out.pir")))
    # SIGTERM is taken as Ctrl-C is (issue 45): during the search the best plan is kept; while the
    # outputs are written (at the first temporary file) it stops, leaving no file behind
    argv = [str(big), "--algo", "cpsat", "--time-limit", "60", "--devices", "4",
            "-p", "coarsen{target=150},place,simulate", *OUT]
    probes.append(cli("kill -TERM pesto-compile during cpsat", k, argv, "ok", interrupt_after=8.0,
                      interrupt_signal=signal.SIGTERM, check=reads_back("out.pir")))
    every_output = ["{msr}", *FAST, *OUT, "--plan-json", "{dir}/p.json", "--trace", "{dir}/t.json",
                    "--gantt", "{dir}/g.svg", "--memory-plot", "{dir}/m.svg"]
    probes.append(cli("kill -TERM pesto-compile as an output's temporary file appears", k, every_output, "stop",
                      interrupt_on=".*.tmp", interrupt_signal=signal.SIGTERM))
    return probes


def all_probes() -> list[Probe]:
    return [*flag_probes(), *output_probes(), *filesystem_probes(), *fanout_probes(), *pipeline_probes(),
            *pir_probes(), *json_probes(), *cluster_probes(), *kind_probes(), *api_probes(), *interrupt_probes()]
