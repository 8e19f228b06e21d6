"""Bad-input probes (issue 16): does `pesto-compile`, `pesto_ir.parse`/`load` or `parallelize`
refuse each bad input with a clear error, or does it crash, hang or lie?

    python3 bench/probe_inputs.py [--kind KIND] [--only NAME] [--timeout 60] [--out bench/results/probes.md]
                                  [--json OUT.json] [--before EARLIER.json] [--label TEXT] [--list]

To compare with another version, run the probes against it first (here a commit, unpacked where
`PYTHONPATH` finds it before the installed package) and pass its `--json` as `--before`:

    git archive COMMIT | tar -x -C /tmp/old && mkdir -p /tmp/oldpkg && cp -r /tmp/old/pesto_ir /tmp/oldpkg/ &&
      for d in passes frontends backends grammar; do cp -r /tmp/old/$d /tmp/oldpkg/pesto_ir/; done
    PYTHONPATH=/tmp/oldpkg python3 bench/probe_inputs.py --json /tmp/before.json --label "commit COMMIT"
    python3 bench/probe_inputs.py --before /tmp/before.json --out bench/results/probes.md

Each probe is one record: a name, a kind, the `pesto-compile` arguments (CLI probes) or Python code
(API probes), the files it needs, and what is right: `error` (it must be refused), `ok` (a valid
input it must accept) or `any` (either is right, as long as it is quick and clean). Every probe runs
in its own subprocess, in a fresh folder holding copies of examples/mlp_train_step.pir (`{mlp}`) and
a small MSR cost graph (`{msr}`, bert24_inference_layer.json), under a timeout. Outcomes:

- `clear error`: exit 1 or 2, a short `error:` line (located where there is a place to point at), no
  traceback, nothing written (for the API: a `PestoError`, with a short message);
- `crash`: a traceback, exit 70 (internal error), a signal, or any other exception;
- `hang`: the timeout passed (or, for an interrupt probe, more than 2 s from Ctrl-C to exit);
- `silently wrong`: exit 0 where it must refuse, an output written or an input changed on failure,
  or a result that a probe's own check finds wrong;
- `poor message`: refused, but the message is missing, huge, or names a temporary file;
- `refused`: a valid input refused;
- `plan lost`: interrupted, it stopped in time but wrote no plan (the issue asks for the best one so far);
- `ok`: a valid input accepted (and its check passed).

It prints a table per kind and a tally (outcomes, and how many probes got what is right); `--out`
writes the same as markdown.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "mlp_train_step.pir"
MSR = ROOT.parent / "shared" / "graphs" / "msr" / "bert24_inference_layer.json"
OUTCOMES = ("ok", "clear error", "crash", "hang", "silently wrong", "poor message", "refused", "plan lost")
RIGHT = {"error": {"clear error"}, "ok": {"ok"}, "any": {"ok", "clear error"}}
MAX_ERROR_CHARS = 5000  # a message longer than this (the issue saw 15 MB) is a poor one
INTERRUPT_GRACE = 2.0  # seconds from Ctrl-C to exit


@dataclass
class Result:
    rc: int | None  # None: timed out
    out: str
    err: str
    seconds: float
    folder: Path
    written: list[str]  # files new or changed in the folder
    after_signal: float | None = None  # interrupt probes: seconds from SIGINT to exit


Check = Callable[[Result], "str | None"]  # what is wrong with a successful run, or None


@dataclass
class Probe:
    name: str
    kind: str
    expect: str  # "error", "ok" or "any"
    argv: list[str] | None = None  # pesto-compile arguments; {mlp}, {msr} and {dir} are replaced
    code: str | None = None  # Python run by the API harness (call wrong("why") for a wrong result)
    # files made in the probe's folder: text, bytes, a function giving either, "->NAME" (a symlink to NAME)
    # or "->RUN:ARGS" (the output of `pesto-compile ARGS`)
    files: dict[str, str | bytes | Callable[[], str | bytes]] = field(default_factory=dict)
    check: Check | None = None
    timeout: float | None = None
    interrupt_after: float | None = None  # CLI: send SIGINT this many seconds after the start
    interrupt_group: bool = False  # to the whole process group (a terminal's Ctrl-C), not pesto-compile alone
    also_clear: tuple[str, ...] = ()  # API: exception types that are a clear error here (JAX's own, as jax.jit's)


# ------------------------------------------------------------------ file contents

GRAPH_DOC = {"format": "pesto-graph/1", "name": "toy",
             "nodes": [{"id": "a", "cost": 0.002, "memory": 1048576},
                       {"id": "b", "cost": 0.003, "activation": 65536},
                       {"id": "c", "cost": {"h100": 0.001, "cpu": 0.02}}],
             "edges": [{"src": "a", "dst": "b", "bytes": 4194304}, {"src": "b", "dst": "c", "bytes": 1024}]}


def graph_json(*, nodes: list | None = None, **top: object) -> str:
    doc = {**GRAPH_DOC, **top}
    if nodes is not None:
        doc["nodes"] = nodes
    return json.dumps(doc)


def node_json(**fields: object) -> str:
    return graph_json(nodes=[{**GRAPH_DOC["nodes"][0], **fields}, *GRAPH_DOC["nodes"][1:]])


def cluster_json(devices: list | None = None, **top: object) -> str:
    doc = {"format": "pesto-cluster/1",
           "devices": devices if devices is not None else [{"name": "g0", "kind": "h100"},
                                                           {"name": "g1", "kind": "h100"}], **top}
    return json.dumps(doc, allow_nan=True)


def one_op(attrs: str, opcode: str = "opaque", typ: str = "blob[4]") -> str:
    return f"graph @g() {{\n  %x = {opcode}() {{{attrs}}} : {typ}\n  return %x\n}}\n"


def mlp_with(old: str, new: str) -> Callable[[], str]:
    return lambda: MLP.read_text().replace(old, new, 1)


TANH = "graph @g(%x: f32[4]) {\n  %y = tanh(%x) : f32[4]\n  return %y\n}\n"

# ------------------------------------------------------------------ checks of successful runs


def stderr_has(text: str) -> Check:
    return lambda r: None if text in r.err else f"no '{text}' on stderr"


def either(*checks: Check) -> Check:
    """Right when one of `checks` is (e.g. a user's value kept, or a warning that it was replaced)."""
    def check(r: Result) -> str | None:
        whys = [c(r) for c in checks]
        return None if None in whys else " and ".join(w for w in whys if w)
    return check


def output_has(path: str, text: str) -> Check:
    def check(r: Result) -> str | None:
        p = r.folder / path
        if not p.exists():
            return f"{path} not written"
        return None if text in p.read_text() else f"{path} lacks '{text}'"
    return check


def reads_back(path: str) -> Check:
    """The written .pir parses again, and its plan does not beat its own lower bound."""
    def check(r: Result) -> str | None:
        p = r.folder / path
        if not p.exists():
            return f"{path} not written"
        proc = subprocess.run([sys.executable, "-c", READ_BACK, str(p)], capture_output=True, text=True)
        return proc.stdout.strip() or (proc.stderr.strip().splitlines() or ["read-back failed"])[-1] \
            if proc.returncode else None
    return check


READ_BACK = """
import sys, pesto_ir
g = pesto_ir.load(sys.argv[1])
plan = g.attrs.get("plan")
if plan is not None:
    p = plan.value
    m, lb = p.get("makespan"), p.get("lower_bound")
    if m is not None and lb is not None and m < lb * (1 - 1e-9):
        print(f"makespan {m} beats its lower bound {lb}"); sys.exit(1)
"""

# ------------------------------------------------------------------ the probes

FAST = ["--algo", "m-etf", "-q"]  # a quick placement: the probe is about the input, not the solver
OUT = ["-o", "{dir}/out.pir"]


def cli(name: str, kind: str, argv: list[str], expect: str, **kw: object) -> Probe:
    return Probe(name, kind, expect, argv=argv, **kw)  # type: ignore[arg-type]


def api(name: str, kind: str, code: str, expect: str, **kw: object) -> Probe:
    return Probe(name, kind, expect, code=code, **kw)  # type: ignore[arg-type]


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
        "Cluster.load(None)": "from pesto_ir.cluster import Cluster; Cluster.load(None)",
        "Cluster.homogeneous(0)": "from pesto_ir.cluster import Cluster; Cluster.homogeneous(0)",
        "Cluster.homogeneous(2, latency=nan)": "from pesto_ir.cluster import Cluster; "
                                               "Cluster.homogeneous(2, latency=float('nan'))",
        "Cluster.homogeneous(2, 'tpu9')": "from pesto_ir.cluster import Cluster; Cluster.homogeneous(2, 'tpu9')",
        'Pipeline.parse("")': "from pesto_ir.passmanager import Pipeline; Pipeline.parse('')",
        "Pipeline.parse(None)": "from pesto_ir.passmanager import Pipeline; Pipeline.parse(None)",
        "Cluster.homogeneous(100000)": "from pesto_ir.cluster import Cluster; Cluster.homogeneous(100000)",
        "Plan.from_json(junk)": "from pesto_ir.plan import Plan; Plan.from_json({'format': 'x'})",
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
    big = ROOT.parent / "shared" / "graphs" / "msr" / "bert_l-3_training_op.json"
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
    return probes


def all_probes() -> list[Probe]:
    return [*flag_probes(), *output_probes(), *pipeline_probes(), *pir_probes(), *json_probes(),
            *cluster_probes(), *api_probes(), *interrupt_probes()]


# ------------------------------------------------------------------ the runner

HARNESS = r"""
import os, sys, traceback
class Wrong(Exception):
    pass
def wrong(why):
    raise Wrong(why)
from pesto_ir import PestoError
try:
    exec(compile(os.environ["PROBE_CODE"], "<probe>", "exec"), {"wrong": wrong, "__name__": "__probe__"})
except Wrong as e:
    print(f"WRONG: {e}", file=sys.stderr)
    sys.exit(3)
except PestoError as e:
    print(f"{type(e).__name__}: {e.format()}", file=sys.stderr)
    sys.exit(1)
except BaseException as e:
    if type(e).__name__ in os.environ["PROBE_ALSO_CLEAR"].split(","):
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    traceback.print_exc()
    sys.exit(70)
"""


def _snapshot(folder: Path) -> dict[str, str]:
    out = {}
    for p in folder.rglob("*"):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _prepare(probe: Probe, folder: Path) -> None:
    shutil.copy(MLP, folder / "mlp.pir")
    shutil.copy(MSR, folder / "msr.json")
    for name, content in probe.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content() if callable(content) else content
        if isinstance(data, str) and data.startswith("->RUN:"):  # made by a pesto-compile run
            argv = [a.replace("{mlp}", str(folder / "mlp.pir")).replace("{dir}", str(folder))
                    for a in data[len("->RUN:"):].split()]
            subprocess.run(["pesto-compile", *argv], check=True, capture_output=True)
        elif isinstance(data, str) and data.startswith("->"):  # a symlink
            path.symlink_to(folder / data[2:])
        elif isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")


def run_probe(probe: Probe, timeout: float) -> tuple[str, str, float]:
    """Run one probe in a fresh folder: (outcome, note, seconds)."""
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        folder = Path(tmp)
        _prepare(probe, folder)
        before = _snapshot(folder)
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
        env.pop("PESTO_TRACEBACK", None)
        if probe.argv is not None:
            cmd = ["pesto-compile", *(a.replace("{mlp}", str(folder / "mlp.pir")).replace("{msr}", str(folder / "msr.json"))
                                      .replace("{dir}", str(folder)) for a in probe.argv)]
        else:
            cmd = [sys.executable, "-c", HARNESS]
            env["PROBE_CODE"] = probe.code or ""
            env["PROBE_ALSO_CLEAR"] = ",".join(probe.also_clear)
        result = _execute(cmd, env, folder, probe.timeout or timeout, probe.interrupt_after, probe.interrupt_group)
        after = _snapshot(folder)
        result.written = sorted(p for p, h in after.items() if before.get(p) != h)
        changed_inputs = sorted(p for p in before if after.get(p) != before[p])
        outcome, note = classify(probe, result, changed_inputs)
        return outcome, note.replace(str(folder), "DIR"), result.seconds


def _default_sigint() -> None:
    """In the child: Ctrl-C as in a terminal, even when this script runs where SIGINT is ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _execute(cmd: list[str], env: dict[str, str], folder: Path, timeout: float,
             interrupt_after: float | None, interrupt_group: bool) -> Result:
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_default_sigint)
    signalled = None
    try:
        if interrupt_after is not None:
            try:
                proc.wait(interrupt_after)
            except subprocess.TimeoutExpired:
                if interrupt_group:  # a terminal's Ctrl-C reaches every process of the group
                    os.killpg(proc.pid, signal.SIGINT)
                else:  # kill -INT PID
                    proc.send_signal(signal.SIGINT)
                signalled = time.monotonic()
        out, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    end = time.monotonic()
    return Result(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), end - start, folder, [],
                  None if signalled is None else end - signalled)


def _first_error_line(err: str) -> str:
    """The first line that says error (with the next one when it only says which pass failed)."""
    lines = [line for line in err.splitlines() if line.strip()]
    i = next((i for i, line in enumerate(lines) if "error" in line.lower()), None)
    if i is None:
        return ""
    return lines[i] + (" " + lines[i + 1].strip() if lines[i].endswith(":") and i + 1 < len(lines) else "")


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def classify(probe: Probe, r: Result, changed_inputs: list[str]) -> tuple[str, str]:
    """The outcome of one run and a note (the message, or what went wrong)."""
    if r.rc is None:
        return "hang", f"no exit after {r.seconds:.0f} s"
    if r.after_signal is not None and r.after_signal > INTERRUPT_GRACE:
        return "hang", f"exit {r.rc} {r.after_signal:.1f} s after Ctrl-C (more than {INTERRUPT_GRACE:g} s)"
    if r.rc < 0:
        return "crash", f"killed by signal {signal.Signals(-r.rc).name}"
    if r.rc == 70 or "Traceback (most recent call last)" in r.err or r.err.lstrip().startswith("internal error"):
        lines = [x for x in r.err.strip().splitlines() if x.strip()]
        return "crash", _short(lines[-1] if lines else f"exit {r.rc}")
    if r.rc == 3:
        return "silently wrong", _short(r.err.strip().removeprefix("WRONG: "))
    if changed_inputs:
        return "silently wrong", f"exit {r.rc}, changed the input {', '.join(changed_inputs)}"
    if r.after_signal is not None and r.rc == 130:
        return "plan lost", f"exit 130 {r.after_signal:.1f} s after Ctrl-C, no plan written" + \
            (f" ({_short(r.err.strip().splitlines()[-1], 60)})" if r.err.strip() else "")
    if r.rc == 0:
        if probe.expect == "error":
            return "silently wrong", f"accepted (exit {r.rc})" + (f", wrote {', '.join(r.written)}" if r.written else "")
        why = probe.check(r) if probe.check else None
        if why:
            return "silently wrong", _short(why)
        return "ok", f"exit {r.rc}" + (f", {r.after_signal:.1f} s after Ctrl-C" if r.after_signal is not None else "")
    if r.rc not in (1, 2):
        return "crash", f"exit {r.rc}: {_short(r.err)}"
    if r.written:
        return "silently wrong", f"exit {r.rc} but wrote {', '.join(r.written)}: {_short(_first_error_line(r.err), 60)}"
    line = _first_error_line(r.err)
    if not line:
        return "poor message", f"exit {r.rc} with no error line: {_short(r.err)}"
    if len(r.err) > MAX_ERROR_CHARS or len(line) > 1000:
        return "poor message", f"{len(r.err)} characters of error text"
    if "/." in line and ".tmp" in line:
        return "poor message", f"names a temporary file: {_short(line)}"
    if probe.expect == "ok":
        return "refused", _short(line)
    return "clear error", _short(line)


# ------------------------------------------------------------------ reporting


Row = tuple[Probe, str, str, float]  # the probe, its outcome, a note, seconds


def markdown(rows: list[Row], command: str, seconds: float, source: str,
             before: dict[tuple[str, str], str] | None = None, before_source: str = "") -> str:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Bad-input probes (issue 16)", "",
             f"`{command}` on {date}: {len(rows)} probes in {seconds:.0f} s, pesto_ir from {source}.", ""]
    if before is not None:
        lines += [f"The before column: the same probes on {before_source}.", ""]
    lines += [*tally(rows, before), ""]
    for kind in dict.fromkeys(p.kind for p, *_ in rows):
        head = ["probe", "expected", *(["before"] if before is not None else []), "outcome", "right", "s", "note"]
        lines += [f"## {kind}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for p, outcome, note, s in rows:
            if p.kind == kind:
                right = "yes" if outcome in RIGHT[p.expect] else "**no**"
                was = [before.get((p.kind, p.name), "-")] if before is not None else []
                cells = [p.name, p.expect, *was, outcome, right, f"{s:.1f}", note]
                lines.append("| " + " | ".join(c.replace("|", "\\|").replace("`", "'") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def tally(rows: list[Row], before: dict[tuple[str, str], str] | None = None) -> list[str]:
    counts = Counter(outcome for _, outcome, _, _ in rows)
    right = sum(outcome in RIGHT[p.expect] for p, outcome, _, _ in rows)
    if before is None:
        out = ["| outcome | probes |", "| --- | --- |"]
        out += [f"| {o} | {counts[o]} |" for o in OUTCOMES]
        return out + [f"| **what is right** | **{right} of {len(rows)}** |"]
    was = {(p.kind, p.name): before.get((p.kind, p.name)) for p, *_ in rows}
    old = Counter(o for o in was.values() if o is not None)
    old_right = sum(was[(p.kind, p.name)] in RIGHT[p.expect] for p, *_ in rows)
    out = ["| outcome | before | after |", "| --- | --- | --- |"]
    out += [f"| {o} | {old[o]} | {counts[o]} |" for o in OUTCOMES]
    return out + [f"| **what is right** | **{old_right} of {len(rows)}** | **{right} of {len(rows)}** |"]


def _source() -> str:
    """Where the probes' pesto_ir comes from (PYTHONPATH may point at another checkout), and its commit."""
    proc = subprocess.run([sys.executable, "-c", "import pesto_ir; print(pesto_ir.__file__)"], capture_output=True,
                          text=True)
    where = Path(proc.stdout.strip()).parent.parent if proc.returncode == 0 else Path("?")
    if where == ROOT:
        head = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True)
        return f"this checkout (commit {head.stdout.strip()}" + (" with uncommitted changes)" if dirty.stdout.strip()
                                                                 else ")")
    return str(where)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", action="append", help="run only probes of this kind (repeatable)")
    ap.add_argument("--only", help="run only probes whose name contains this")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per probe (default 60)")
    ap.add_argument("--out", help="write the tally and tables as markdown")
    ap.add_argument("--json", help="write the outcomes as JSON (for --before of a later run)")
    ap.add_argument("--before", help="a --json file of an earlier run: show its outcomes beside these")
    ap.add_argument("--label", help="say this of the pesto_ir under test (default: where it is imported from)")
    ap.add_argument("--list", action="store_true", help="list the probes and exit")
    args = ap.parse_args(argv)
    probes = [p for p in all_probes() if (not args.kind or p.kind in args.kind)
              and (not args.only or args.only in p.name)]
    if args.list:
        for p in probes:
            print(f"{p.kind:14} {p.expect:6} {p.name}")
        return 0
    source = args.label or _source()
    rows: list[Row] = []
    start = time.monotonic()
    for i, p in enumerate(probes, 1):
        outcome, note, s = run_probe(p, args.timeout)
        rows.append((p, outcome, note, s))
        flag = "" if outcome in RIGHT[p.expect] else "  <-- "
        print(f"[{i}/{len(probes)}] {p.kind}: {p.name}: {outcome} ({s:.1f} s){flag}{note if flag else ''}", flush=True)
    seconds = time.monotonic() - start
    print()
    command = "python3 bench/probe_inputs.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    before, before_source = None, ""
    if args.before:
        data = json.loads(Path(args.before).read_text(encoding="utf-8"))
        before = {(r["kind"], r["name"]): r["outcome"] for r in data["rows"]}
        before_source = data["source"]
    text = markdown(rows, command, seconds, source, before, before_source)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "source": source, "rows": [
            {"kind": p.kind, "name": p.name, "expect": p.expect, "outcome": o, "note": n, "seconds": round(sec, 2)}
            for p, o, n, sec in rows]}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
