"""Bad input to pesto-compile never crashes, hangs or lies: it is refused early, with a message that says why."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import pesto_ir
import pesto_ir.cli
from pesto_ir import Graph, ParseError, PestoError
from pesto_ir.cli import main
from pesto_ir.cluster.devices import Device, kind_key
from pesto_ir.cluster.model import Cluster
from pesto_ir.cost.lookup import op_cost
from pesto_ir.passes import PASSES
from pesto_ir.passes.place import MAX_DEFAULT_TIME_LIMIT
from pesto_ir.passes.placement.exact.cpsat_problem import Problem, Request
from pesto_ir.passes.placement.exact.cpsat_worker import SolverProcess
from pesto_ir.passes.placement.heuristics.portfolio import best_heuristic_plan
from pesto_ir.passes.placement.options import Incumbent, PlaceOptions
from pesto_ir.passes.placement.registry import ALGORITHMS
from pesto_ir.passes.placement.search.auto import place_auto
from pesto_ir.passes.rewrite.coarse_graph import quotient_graph
from pesto_ir.passmanager import Pass, PassContext, PassManager, Pipeline
from pesto_ir.schedule.bounds import lower_bound
from pesto_ir.schedule.plan import read_plan_attrs
from pesto_ir.schedule.validate import check_plan

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mlp_train_step.pir"
FAST = ["--devices", "1", "-p", "annotate-costs,simulate", "-q"]  # one device: no placement to wait for


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the CLI gets as far as loading the model: the refusal must come first."""

    def load(*args: object, **kwargs: object) -> None:
        pytest.fail("the model was loaded before the bad arguments were refused")

    monkeypatch.setattr(pesto_ir.cli, "load", load)


# 1. time limits ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "1e999", "soon"])
def test_time_limit_flag_refuses_what_is_not_a_positive_finite_time(value: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([str(EXAMPLE), "--algo", "m-etf", f"--time-limit={value}", "-q"])  # = form: argparse reads -inf as a flag
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"argument --time-limit: '{value}' is not a positive, finite number of seconds" in err


@pytest.mark.parametrize("flag, value, message", [
    ("--time-limit", "1e300", "argument --time-limit: must be at most 1e+06 seconds, not 1e+300"),
    ("--seed", "2147483648", "argument --seed: must be a whole number from 0 to 2147483647, not 2147483648"),
    ("--seed", "-1", "argument --seed: must be a whole number from 0 to 2147483647, not -1"),
    ("--seed", "1.5", "argument --seed: '1.5' is not a whole number"),
])
def test_time_limits_and_seeds_past_what_the_solvers_take_are_refused(flag: str, value: str, message: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """CP-SAT crashed on a deadline of 1e300 s (time_t overflow) and printed a four-line binding
    error for a seed past 32 bits."""
    with pytest.raises(SystemExit) as e:
        main([str(EXAMPLE), "--algo", "cpsat", f"{flag}={value}", "-q"])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_time_limit_flag_takes_a_fraction_of_a_second(tmp_path: Path) -> None:
    out = tmp_path / "out.pir"
    assert main([str(EXAMPLE), "--devices", "2", "--algo", "m-etf", "--time-limit", "0.5", "-o", str(out), "-q"]) == 0
    assert out.exists()


@dataclass(frozen=True)
class Scale(Pass):
    """A pass with a float option and no checks of its own: the parser must still refuse NaN and infinity."""

    name = "scale"
    factor: float = 1.0

    def run(self, graph: Graph, ctx: PassContext) -> None:
        pass


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "infinity", "1e999"])
def test_pipeline_float_options_must_be_finite(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PASSES, Scale.name, Scale)
    text = f"verify,scale{{factor={value}}}"
    with pytest.raises(ParseError) as info:
        Pipeline.parse(text)
    assert info.value.message == f"pass 'scale': bad value for option 'factor': expected a finite number, got '{value}'"
    assert info.value.span.col == text.index("=") + 2  # the caret is under the value
    (p,) = Pipeline.parse("scale{factor=2.5e-1}").passes
    assert p == Scale(factor=0.25)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "-1", "0"])
def test_pipeline_refuses_a_place_time_limit_that_is_not_positive_and_finite(value: str,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    text = f"annotate-costs,place{{time-limit={value}}}"
    with pytest.raises(ParseError, match="pass 'place'.*time-limit"):
        Pipeline.parse(text)
    assert main([str(EXAMPLE), "--devices", "2", "-p", text, "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("<pipeline>:1:") and "pass 'place'" in err and "time-limit" in err
    assert "Traceback" not in err and "internal error" not in err


def test_pipeline_refuses_an_unknown_algorithm_with_its_position() -> None:
    with pytest.raises(ParseError, match="bad options for pass 'place': unknown placement algorithm 'turbo'") as info:
        Pipeline.parse("verify,place{algo=turbo}")
    assert info.value.span.col == len("verify,") + 1


# 2. empty pipelines -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   "])
def test_an_empty_pipeline_is_an_error_not_a_silent_no_op(text: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ParseError, match="the pipeline is empty"):
        Pipeline.parse(text)
    out = tmp_path / "out.pir"
    assert main([str(EXAMPLE), "-p", text, "-o", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert "error: the pipeline is empty" in err and "annotate-costs" in err  # the hint lists the passes
    assert not out.exists()


# 3. repeated options ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["place{algo=ilp algo=m-etf}", "place{algo=m-etf algo=m-etf}",
                                  "annotate-costs,place{seed=1 algo=m-etf seed=2}"])
def test_a_repeated_pass_option_is_an_error_naming_it(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    key = text[text.index("{") + 1:text.index("=")]
    with pytest.raises(ParseError) as info:
        Pipeline.parse(text)
    assert info.value.span.col == text.rindex(f" {key}=") + 2  # the caret is under the second one
    assert main([str(EXAMPLE), "--devices", "2", "-p", text, "-q"]) == 1
    assert f"option '{key}' given twice for pass 'place'" in capsys.readouterr().err


# 4. output paths --------------------------------------------------------------------------------------------


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model.pir"
    shutil.copy(EXAMPLE, model)
    return model


@pytest.mark.parametrize("spelling", ["same", "dotted", "symlink"])
def test_output_over_the_input_model_is_refused_before_any_work(spelling: str, tmp_path: Path, no_work: None,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path)
    (tmp_path / "sub").mkdir()
    if spelling == "symlink":
        (tmp_path / "link.pir").symlink_to(model)
    out = {"same": model, "dotted": tmp_path / "sub" / ".." / "model.pir", "symlink": tmp_path / "link.pir"}[spelling]
    before = model.read_bytes()
    assert main([str(model), *FAST, "-o", str(out)]) == 1
    assert f"-o '{out}' would overwrite the input '{model}'" in capsys.readouterr().err
    assert model.read_bytes() == before


@pytest.mark.parametrize("first, second", [("-o", "--plan-json"), ("--trace", "--gantt"),
                                           ("--plan-json", "--memory-plot"), ("-o", "--trace")])
def test_two_outputs_to_one_path_are_refused_before_any_work(first: str, second: str, tmp_path: Path,
                                                             no_work: None, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "same.out"
    assert main([str(EXAMPLE), *FAST, first, str(path), second, str(tmp_path / "." / "same.out")]) == 1
    assert f"{first} and {second} both write to" in capsys.readouterr().err
    assert not path.exists()


def test_two_outputs_to_stdout_are_refused(no_work: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(EXAMPLE), *FAST, "-o", "-", "--plan-json", "-"]) == 1
    assert "-o and --plan-json both write to stdout" in capsys.readouterr().err


def test_one_output_to_stdout_and_one_to_a_file_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    assert main([str(EXAMPLE), *FAST, "-o", "-", "--plan-json", str(plan)]) == 0
    assert capsys.readouterr().out.startswith("graph @mlp_train_step(")
    assert plan.exists()


@pytest.mark.parametrize("flag", ["-o", "--plan-json", "--trace", "--gantt", "--memory-plot"])
def test_an_output_in_a_missing_folder_is_refused_before_any_work(flag: str, tmp_path: Path, no_work: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "missing" / "out.png"
    assert main([str(EXAMPLE), *FAST, flag, str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{flag} '{path}': folder '{path.parent}' does not exist" in err
    assert not path.parent.exists()


def test_an_output_that_is_a_folder_is_refused_before_any_work(tmp_path: Path, no_work: None,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(EXAMPLE), *FAST, "--trace", str(tmp_path)]) == 1
    assert f"--trace '{tmp_path}' is a folder, not a file" in capsys.readouterr().err


def test_an_output_path_ending_in_a_slash_is_refused(tmp_path: Path, no_work: None,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`-o new/` wrote a file called `new`."""
    path = str(tmp_path / "new") + "/"
    assert main([str(EXAMPLE), *FAST, "-o", path]) == 1
    assert f"-o '{path}' ends in '/', as a folder does: name the file to write" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_takes_no_new_file_is_refused_before_any_work(tmp_path: Path, no_work: None,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The write failed only after the whole run, naming a hidden temporary file. (As root, a folder's
    permissions do not stop a new file: its making is refused here instead.)"""
    real_open = os.open

    def refuse_new_files(path: str, flags: int, *args: int) -> int:
        if flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse_new_files)
    out = tmp_path / "out.pir"
    assert main([str(EXAMPLE), *FAST, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"-o '{out}': cannot write in folder '{tmp_path}': Permission denied" in err and ".tmp" not in err


def test_python_of_a_cost_graph_is_refused_before_placing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`--emit python` of a pesto-graph/1 cost graph wrote a module that runs nothing."""
    model = tmp_path / "g.json"
    model.write_text('{"format": "pesto-graph/1", "nodes": [{"id": "a", "cost": 0.001}, {"id": "b", "cost": 0.002}],'
                     ' "edges": [{"src": "a", "dst": "b", "bytes": 64}]}')
    monkeypatch.setattr(pesto_ir.cli, "PassManager", lambda *a, **k: pytest.fail("the graph was placed"))
    out = tmp_path / "m.py"
    assert main([str(model), "--emit", "python", "-o", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert "@g is a cost graph: op 'a' (opaque) gives %a: blob[64], a cost-only value" in err
    assert not out.exists()


# 5 and 6. --version and --help ------------------------------------------------------------------------------


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"pesto-compile {pesto_ir.__version__}\n"
    assert pesto_ir.__version__ == importlib.metadata.version("pesto-ir")


def test_help_lists_the_algorithms_and_the_default_time_limit(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside a name such as cpsat-lns
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert ", ".join(sorted(ALGORITHMS)) in out
    assert f"at most {MAX_DEFAULT_TIME_LIMIT:g} s)" in out


def test_help_works_in_a_fresh_interpreter() -> None:
    """build_arg_parser imports the place pass lazily: no import cycle when the CLI is the first import."""
    proc = subprocess.run([sys.executable, "-m", "pesto_ir.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "m-etf" in proc.stdout


# 7. Ctrl-C --------------------------------------------------------------------------------------------------

MSR_OPS = ROOT / "graphs" / "msr" / "bert_l-3_training_op.json"  # CP-SAT runs its whole limit


def _terminal_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as in a terminal, even where the test runner ignores it


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_cpsat_stops_within_2_s_and_keeps_the_best_plan(tmp_path: Path, signum: int) -> None:
    """SIGINT to pesto-compile (`kill -INT PID`): it stopped 5 s later, waiting for the worker, busy in
    native code, to end its request, then wrote nothing; now it kills the worker at once, keeps the
    last incumbent the worker sent (or the warm start) and finishes the pipeline with it. SIGTERM
    (what `timeout` and job schedulers send) is taken the same way."""
    out = tmp_path / "out.pir"
    proc = subprocess.Popen([sys.executable, "-m", "pesto_ir.cli", str(MSR_OPS), "--algo", "cpsat", "--time-limit",
                             "60", "--devices", "4", "-p", "coarsen{target=150},place,simulate", "-o", str(out)],
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_terminal_sigint)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if line.startswith("cpsat:") and "incumbent" in line:  # the worker is solving
                break
        else:
            pytest.fail("CP-SAT ended before the signal, so the signal was not tested")
        proc.send_signal(signum)
        signalled = time.monotonic()
        err = proc.communicate(timeout=60)[1]
        stopped = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert stopped < 2.0, f"{stopped:.1f} s from the signal to exit"
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "place: interrupted (Ctrl-C); keeping the best plan found so far" in err
    plan = read_plan_attrs(pesto_ir.load(out))
    assert plan is not None and plan.algorithm == "cpsat" and plan.solver["status"] == "interrupted"
    assert any(n.startswith("interrupted (Ctrl-C) after") for n in plan.notes)


def _interrupted_after(seconds: float, place: Callable[[Incumbent], object]) -> Incumbent:
    """What `place` kept in its sink when SIGINT came `seconds` into it (the test fails if it returns
    first, or if the interrupt does not reach the caller)."""
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    kept = Incumbent()
    try:
        place(kept)
    except KeyboardInterrupt:
        return kept
    finally:
        timer.cancel()
    pytest.fail("placement ended before the interrupt, so the interrupt was not tested")


@pytest.mark.usefixtures("sigint_reaches_python")
@pytest.mark.slow
def test_ctrl_c_during_auto_keeps_its_best_plan() -> None:
    """`auto` on one batch of 150 coarse groups (more than its whole CP-SAT model takes: it runs LNS
    to the time limit), interrupted: the best of its stages so far, valid, no slower than the
    heuristics' plan it started from, with the status and a note."""
    graph, cluster = pesto_ir.load(MSR_OPS), Cluster.homogeneous(4, "v100")
    coarse = PassManager("coarsen{target=150}").run(graph, PassContext(cluster=cluster, quiet=True))
    quotient, _ = quotient_graph(coarse, cluster)
    e = _interrupted_after(2.5, lambda kept: place_auto(quotient, cluster,
                                                         PlaceOptions(time_limit=60, quiet=True, incumbent=kept)))
    assert e.graph is quotient and e.plan is not None
    check_plan(quotient, cluster, e.plan)
    heuristic = best_heuristic_plan(quotient, cluster, PlaceOptions(quiet=True))
    assert heuristic is not None and e.plan.makespan <= heuristic.makespan
    assert e.plan.solver["status"] == "interrupted" and "interrupted (Ctrl-C)" in e.plan.notes[-1]


@pytest.mark.usefixtures("sigint_reaches_python")
@pytest.mark.slow
def test_ctrl_c_during_the_hybrid_search_records_the_fastest_plan_screened() -> None:
    """The place pass searching replicas x micro-batches, interrupted: it records the fastest plan
    screened so far in the graph it is a plan of, and the pipeline goes on."""
    graph, cluster = pesto_ir.load(MSR_OPS), Cluster.homogeneous(4, "v100")
    ctx = PassContext(cluster=cluster, quiet=True)
    coarse = PassManager("coarsen{target=150}").run(graph, ctx)
    timer = threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        placed = PassManager("place{algo=auto time-limit=60}").run(coarse, ctx)
    finally:
        timer.cancel()
    plan = read_plan_attrs(placed)
    assert plan is not None and plan.algorithm == "auto" and plan.solver["status"] == "interrupted"
    check_plan(placed, cluster, plan)


@pytest.mark.usefixtures("sigint_reaches_python")
def test_an_interrupted_cpsat_request_leaves_no_stale_answer() -> None:
    """Interrupted while waiting, the caller kills the worker: the next request restarts it and gets its
    own answer, not the interrupted request's."""
    big, cluster = pesto_ir.load(MSR_OPS), Cluster.homogeneous(4, "v100")
    small = pesto_ir.parse("graph @g() {\n  %a = opaque() {cost = 1ms} : blob[4]\n"
                           "  %b = opaque(%a) {cost = 2ms} : blob[4]\n}\n")
    with SolverProcess() as solver:
        timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                solver.solve(Request(Problem.build(big, cluster, None, lower_bound(big, cluster)), None, 30.0,
                                     time.monotonic() + 30.0))
        finally:
            timer.cancel()
        assert solver.proc is None  # killed, not left to finish the request
        result = solver.solve(Request(Problem.build(small, cluster, None, 0.003), None, 10.0, time.monotonic() + 10.0))
        assert result.status == "optimal" and result.solution is not None and len(result.solution.device) == 2


@pytest.mark.parametrize("hint, message", [
    ('"x"', "graph 'g': suggested_cluster must be an object like {devices: 4, memory: 8e10}, got 'x'"),
    ("{devices = 2.5}", "graph 'g': suggested_cluster: devices must be a whole number >= 1, got 2.5"),
    ("{devices = -3}", "graph 'g': suggested_cluster: devices must be a whole number >= 1, got -3"),
    ("{devices = true}", "graph 'g': suggested_cluster: devices must be a whole number >= 1, got True"),
    ('{memory = "big"}', "graph 'g': suggested_cluster: memory must be a positive number of bytes, got 'big'"),
])
def test_a_bad_suggested_cluster_in_text_is_a_clear_error(hint: str, message: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON reader checked the hint; from .pir text a string crashed the CLI (AttributeError)
    and 2.5 devices were quietly taken as 2."""
    model = tmp_path / "g.pir"
    model.write_text(f"graph @g(%x: f32[4,4]) attributes {{suggested_cluster = {hint}}} {{\n"
                     "  %y = neg(%x) : f32[4,4]\n  return %y\n}\n")
    assert main([str(model), "-q", "-o", str(tmp_path / "out.pir")]) == 1
    assert message in capsys.readouterr().err and not (tmp_path / "out.pir").exists()


# 8. device kinds, whatever their case (issue 45) ---------------------------------------------------------------


def _cost_graph(key: str) -> str:
    nodes = [{"id": n, "cost": {key: t}} for n, t in (("a", 0.002), ("b", 0.003))]
    return json.dumps({"format": "pesto-graph/1", "nodes": nodes, "edges": [{"src": "a", "dst": "b", "bytes": 64}]})


@pytest.mark.parametrize("cost_key, cluster_kind", [("H100", "h100"), ("h100", "H100"), ("NPU", "Npu")])
def test_costs_keyed_by_a_kind_fit_its_devices_whatever_the_case(cost_key: str, cluster_kind: str,
                                                                tmp_path: Path) -> None:
    """Costs keyed "H100" on an h100 cluster were refused ("has no cost for device gpu0 (kind h100);
    it has costs for: H100"), and so were costs keyed "h100" on a cluster file's kind "H100"."""
    model, cluster = tmp_path / "g.json", tmp_path / "c.json"
    model.write_text(_cost_graph(cost_key))
    cluster.write_text(json.dumps({"format": "pesto-cluster/1", "devices": [
        {"name": f"x{i}", "kind": cluster_kind, "memory": 1e10} for i in range(2)]}))
    out = tmp_path / "out.pir"
    assert main([str(model), "--cluster", str(cluster), "--algo", "m-etf", "-q", "-o", str(out)]) == 0
    plan = read_plan_attrs(pesto_ir.load(out))
    assert plan is not None and plan.makespan >= 0.005 - 1e-12


def test_a_device_keeps_its_kind_in_one_form_and_op_cost_reads_any_case() -> None:
    """One normalising function (`kind_key`): the device's kind, the built-in kinds and cost keys."""
    device = Device("x0", "H100", 1e12, 1e11, 1e9)
    assert device.kind == kind_key("H100") == "h100" and Device.of_kind("g0", "V100").kind == "v100"
    op = pesto_ir.parse('graph @g() {\n  %a = opaque() {cost = {H100 = 2ms, x0 = 1ms}} : blob[4]\n}\n').ops[0]
    assert op_cost(op, device) == pytest.approx(1e-3)  # a device's name first, as written
    assert op_cost(op, Device.of_kind("g0", "h100")) == pytest.approx(2e-3)
    with pytest.raises(PestoError, match="has no cost for device g0 \\(kind v100\\)"):
        op_cost(op, Device.of_kind("g0", "v100"))


def test_device_kind_flag_takes_any_case(tmp_path: Path) -> None:
    for kind in ("H100", "h100"):
        assert main([str(EXAMPLE), "--devices", "1", "--device-kind", kind, "-p", "annotate-costs,simulate", "-q",
                     "-o", str(tmp_path / f"{kind}.pir")]) == 0
    assert (tmp_path / "H100.pir").read_text() == (tmp_path / "h100.pir").read_text()
