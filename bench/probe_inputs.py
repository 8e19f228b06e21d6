"""Bad-input probes (issues 16 and 45): does `pesto-compile`, `pesto_ir.parse`/`load` or `parallelize`
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
- `hang`: the timeout passed (or, for an interrupt probe, more than 2 s from the signal to exit);
- `silently wrong`: exit 0 where it must refuse, an output written or an input changed on failure,
  or a result that a probe's own check finds wrong;
- `poor message`: refused, but the message is missing, huge, names a temporary file or an empty
  file name, or does not say what the probe's `says` asks for (the file that is in the way, stdout);
- `refused`: a valid input refused;
- `plan lost`: interrupted, it stopped in time but wrote no plan (the issue asks for the best one so far);
- `stopped`: signalled outside the search (a `stop` probe), it stopped in time with exit 130 or 143,
  no traceback, and left no file behind, temporary ones included;
- `ok`: a valid input accepted (and its check passed).

It prints a table per kind and a tally (outcomes, and how many probes got what is right); `--out`
writes the same as markdown.

This file runs the probes and reports on them; the probes themselves are listed in
`bench/probe_cases.py`, and the records and helpers they are made of are in `bench/probe_records.py`
(import them from there).
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Iterator
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.probe_cases` when run as a script
from bench.probe_cases import all_probes  # noqa: E402
from bench.probe_records import (  # noqa: E402
    MLP,
    MSR,
    ROOT,
    Probe,
    Result,
)

OUTCOMES = ("ok", "clear error", "stopped", "crash", "hang", "silently wrong", "poor message", "refused", "plan lost")
RIGHT = {"error": {"clear error"}, "ok": {"ok"}, "any": {"ok", "clear error"}, "stop": {"stopped"}}
MAX_ERROR_CHARS = 5000  # a message longer than this (the issue saw 15 MB) is a poor one
INTERRUPT_GRACE = 2.0  # seconds from Ctrl-C to exit


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
    """What is in `folder`: a hash of each regular file, the target of each symbolic link, and each
    folder and other entry by its type, so that a folder or link left behind counts as written (a
    FIFO is not read: that would hang the prober)."""
    out = {}
    for p in folder.rglob("*"):
        name = str(p.relative_to(folder))
        if p.is_symlink():
            out[name] = f"link to {os.readlink(p)}"
        elif p.is_file():
            out[name] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[name] = "folder"
        else:
            out[name] = "other"
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
        elif data == "->FIFO":
            os.mkfifo(path)
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
        result = _execute(cmd, env, folder, probe.timeout or timeout, probe)
        after = _snapshot(folder)
        result.written = sorted(p for p, h in after.items() if before.get(p) != h)
        changed_inputs = sorted(p for p in before if after.get(p) != before[p])
        outcome, note = classify(probe, result, changed_inputs)
        return outcome, note.replace(str(folder), "DIR"), result.seconds


def _default_sigint() -> None:
    """In the child: Ctrl-C as in a terminal, even when this script runs where SIGINT is ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _closed_stdout() -> None:
    """In the child: start with stdout closed, as `cmd >&-` does."""
    _default_sigint()
    os.close(1)


def _execute(cmd: list[str], env: dict[str, str], folder: Path, timeout: float, probe: Probe) -> Result:
    start = time.monotonic()
    with _stdout_for(probe) as stdout:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=stdout, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_closed_stdout if probe.stdout == "closed" else _default_sigint)
    signalled = None
    try:
        if _signal_due(proc, folder, probe):
            if probe.interrupt_group:  # a terminal's Ctrl-C reaches every process of the group
                os.killpg(proc.pid, probe.interrupt_signal)
            else:  # kill -INT PID
                proc.send_signal(probe.interrupt_signal)
            signalled = time.monotonic()
        out, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    end = time.monotonic()
    return Result(rc, (out or b"").decode("utf-8", "replace"), err.decode("utf-8", "replace"), end - start, folder,
                  [], None if signalled is None else end - signalled)


@contextlib.contextmanager
def _stdout_for(probe: Probe) -> Iterator[int | IO[bytes]]:
    """The child's stdout: a pipe read by the prober, or the file the probe names (/dev/full)."""
    if probe.stdout is None:
        yield subprocess.PIPE
    elif probe.stdout == "closed":
        yield subprocess.DEVNULL  # then closed in the child
    else:
        with open(probe.stdout, "wb") as f:
            yield f


def _signal_due(proc: subprocess.Popen[bytes], folder: Path, probe: Probe) -> bool:
    """Wait until the probe's signal is due: `interrupt_after` seconds, or the first non-empty file
    matching `interrupt_on` (polled every 0.2 ms: an output's temporary file lives a few
    milliseconds; the empty ones made to check a folder before the run do not count). False when
    there is no signal to send, or the command ended first."""
    if probe.interrupt_after is not None:
        try:
            proc.wait(probe.interrupt_after)
        except subprocess.TimeoutExpired:
            return True
        return False
    if probe.interrupt_on is not None:
        while proc.poll() is None:
            if any(_size(p) for p in folder.glob(probe.interrupt_on)):
                return True
            time.sleep(0.0002)
    return False


def _size(path: Path) -> int:
    """Bytes in `path`; 0 when it is gone already."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


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
    sent = signal.Signals(probe.interrupt_signal).name
    if r.rc is None:
        return "hang", f"no exit after {r.seconds:.0f} s"
    if r.after_signal is not None and r.after_signal > INTERRUPT_GRACE:
        return "hang", f"exit {r.rc} {r.after_signal:.1f} s after {sent} (more than {INTERRUPT_GRACE:g} s)"
    if r.rc < 0:
        return "crash", f"killed by signal {signal.Signals(-r.rc).name}"
    if r.rc == 70 or "Traceback (most recent call last)" in r.err or r.err.lstrip().startswith("internal error"):
        lines = [x for x in r.err.strip().splitlines() if x.strip()]
        return "crash", _short(lines[-1] if lines else f"exit {r.rc}")
    if r.rc == 3:
        return "silently wrong", _short(r.err.strip().removeprefix("WRONG: "))
    if changed_inputs:
        return "silently wrong", f"exit {r.rc}, changed the input {', '.join(changed_inputs)}"
    if probe.expect == "stop" and r.after_signal is not None and r.rc in (130, 143):
        if r.written:
            return "silently wrong", f"exit {r.rc} after {sent} but left {', '.join(r.written)}"
        return "stopped", f"exit {r.rc} {r.after_signal:.2f} s after {sent}, nothing left behind: " + \
            _short(r.err.strip().splitlines()[-1] if r.err.strip() else "", 60)
    if r.after_signal is not None and r.rc in (130, 143):
        return "plan lost", f"exit {r.rc} {r.after_signal:.1f} s after {sent}, no plan written" + \
            (f" ({_short(r.err.strip().splitlines()[-1], 60)})" if r.err.strip() else "")
    if r.rc == 0:
        if probe.expect == "error":
            return "silently wrong", f"accepted (exit {r.rc})" + (f", wrote {', '.join(r.written)}" if r.written else "")
        why = probe.check(r) if probe.check else None
        if why:
            return "silently wrong", _short(why)
        if probe.expect == "stop" and r.after_signal is None:
            return "ok", f"exit {r.rc} before the {sent} was sent"
        return "ok", f"exit {r.rc}" + (f", {r.after_signal:.1f} s after {sent}" if r.after_signal is not None else "")
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
    if "error: : " in line:  # an OSError whose file name is empty: which file, or stdout?
        return "poor message", f"names no file: {_short(line)}"
    if probe.says and probe.says.lower() not in r.err.lower():
        return "poor message", f"does not say '{probe.says}': {_short(line)}"
    if probe.expect == "ok":
        return "refused", _short(line)
    return "clear error", _short(line)


# ------------------------------------------------------------------ reporting


Row = tuple[Probe, str, str, float]  # the probe, its outcome, a note, seconds


def markdown(rows: list[Row], command: str, seconds: float, source: str,
             before: dict[tuple[str, str], str] | None = None, before_source: str = "") -> str:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Bad-input probes (issues 16 and 45)", "",
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
