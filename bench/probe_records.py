"""What the bad-input probes (`bench/probe_inputs.py`) are made of: the probe and result records,
the inputs they write and the checks of a successful run.

`Probe` and `Result`, the paths of the example inputs (`{mlp}`, `{msr}`), helpers that make bad
`.pir`, JSON graph and cluster files, the checks (`reads_back`, `output_has`, ...) and the `cli`/`api`
constructors. Kept apart from the probe lists (`bench/probe_cases.py`) and the runner and report
(`bench/probe_inputs.py`) so that each file stays short; it imports neither.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "mlp_train_step.pir"
MSR = ROOT / "graphs" / "msr" / "bert24_inference_layer.json"


@dataclass
class Result:
    rc: int | None  # None: timed out
    out: str
    err: str
    seconds: float
    folder: Path
    written: list[str]  # files new or changed in the folder
    after_signal: float | None = None  # interrupt probes: seconds from the signal to exit


Check = Callable[[Result], "str | None"]  # what is wrong with a successful run, or None


@dataclass
class Probe:
    name: str
    kind: str
    # "error", "ok", "any" (either, quick and clean) or "stop" (signalled outside the search: it
    # must stop cleanly, leaving nothing behind)
    expect: str
    argv: list[str] | None = None  # pesto-compile arguments; {mlp}, {msr} and {dir} are replaced
    code: str | None = None  # Python run by the API harness (call wrong("why") for a wrong result)
    # files made in the probe's folder: text, bytes, a function giving either, "->NAME" (a symlink to NAME),
    # "->FIFO" (a named pipe nobody writes) or "->RUN:ARGS" (the output of `pesto-compile ARGS`)
    files: dict[str, str | bytes | Callable[[], str | bytes]] = field(default_factory=dict)
    check: Check | None = None
    timeout: float | None = None
    interrupt_after: float | None = None  # CLI: send the signal this many seconds after the start
    interrupt_on: str | None = None  # CLI: send the signal when a non-empty file matching this glob appears
    interrupt_signal: int = signal.SIGINT
    interrupt_group: bool = False  # to the whole process group (a terminal's Ctrl-C), not pesto-compile alone
    stdout: str | None = None  # CLI: "closed", or a file such as /dev/full; None: a pipe the prober reads
    says: str | None = None  # a refusal's message must say this (any case), or it is a poor one
    also_clear: tuple[str, ...] = ()  # API: exception types that are a clear error here (JAX's own, as jax.jit's)


# ------------------------------------------------------------------ file contents

GRAPH_DOC: dict[str, Any] = {"format": "pesto-graph/1", "name": "toy",
             "nodes": [{"id": "a", "cost": 0.002, "memory": 1048576},
                       {"id": "b", "cost": 0.003, "activation": 65536},
                       {"id": "c", "cost": {"h100": 0.001, "cpu": 0.02}}],
             "edges": [{"src": "a", "dst": "b", "bytes": 4194304}, {"src": "b", "dst": "c", "bytes": 1024}]}


def graph_json(*, nodes: list[Any] | None = None, **top: object) -> str:
    doc = {**GRAPH_DOC, **top}
    if nodes is not None:
        doc["nodes"] = nodes
    return json.dumps(doc)


def node_json(**fields: object) -> str:
    return graph_json(nodes=[{**GRAPH_DOC["nodes"][0], **fields}, *GRAPH_DOC["nodes"][1:]])


def cluster_json(devices: list[Any] | None = None, **top: object) -> str:
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

# ------------------------------------------------------------------ making probes

FAST = ["--algo", "m-etf", "-q"]  # a quick placement: the probe is about the input, not the solver
OUT = ["-o", "{dir}/out.pir"]


def cli(name: str, kind: str, argv: list[str], expect: str, **kw: object) -> Probe:
    return Probe(name, kind, expect, argv=argv, **kw)  # type: ignore[arg-type]


def api(name: str, kind: str, code: str, expect: str, **kw: object) -> Probe:
    return Probe(name, kind, expect, code=code, **kw)  # type: ignore[arg-type]
