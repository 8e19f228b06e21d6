"""`parallelize(..., autotune=True)`, and by default ("auto"): candidates timed on the devices, the
fastest runs, and what it exposes (plan, executable, report) says which won."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pesto_ir
import pesto_ir.parallel.autotune as autotune
from pesto_ir.backends.jax import Executable
from pesto_ir.cluster.model import Cluster
from pesto_ir.ir.graph import donated_inputs
from pesto_ir.parallel.arguments import JitExecutable
from pesto_ir.parallel.options import ParallelizeOptions
from pesto_ir.schedule.plan import read_plan_attrs


def _step(p: Any, x: jax.Array, y: jax.Array) -> Any:
    def loss(p: Any) -> jax.Array:
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)

    value, grads = jax.value_and_grad(loss)(p)
    return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads), value


def _inputs(batch: int = 8) -> tuple[Any, jax.Array, jax.Array]:
    k = jax.random.split(jax.random.key(0), 4)
    p = {"w1": jax.random.normal(k[0], (6, 8)), "w2": jax.random.normal(k[1], (8, 2))}
    return p, jax.random.normal(k[2], (batch, 6)), jax.random.normal(k[3], (batch, 2))


def test_autotune_runs_the_fastest_candidate_with_jit_s_numbers() -> None:
    p, x, y = _inputs()
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:4], param_argnums=0, autotune=True, autotune_steps=2)
    for _ in range(2):  # the first call tunes, the second runs the winner alone
        got = run(p, x, y)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(jax.jit(_step)(p, x, y))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    last = run.last
    assert [c.name for c in last.candidates] == ["plan", "jit", "data-parallel"]
    timed = [c for c in last.candidates if c.measured is not None]
    assert len(timed) == 3 and all(c.predicted is not None and c.predicted > 0 for c in timed)
    assert last.chosen == autotune.preferred(timed).name
    table = run.report()
    assert "| chosen |" in table and table.count("\n| ") == 3
    if last.chosen == "data-parallel":
        assert last.plan.parallelism is not None and last.plan.parallelism.data_parallel == 4


def test_a_candidate_that_cannot_be_built_is_listed_with_why() -> None:
    """A batch of 6 does not split over 4 replicas: data parallelism is no candidate, and says why."""
    p, x, y = _inputs(batch=6)
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:4], param_argnums=0, autotune=True, autotune_steps=1)
    run(p, x, y)
    dp = next(c for c in run.last.candidates if c.name == "data-parallel")
    assert dp.run is None and dp.measured is None and "does not split" in dp.why
    assert run.last.chosen in ("plan", "jit")


def test_without_autotune_the_plan_runs_and_the_report_says_so() -> None:
    p, x, y = _inputs()
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:2], param_argnums=0, autotune=False)
    run(p, x, y)
    assert run.last.candidates == [] and "not autotuned (autotune=False)" in run.report()
    assert run.plan.algorithm == "m-etf" and not any("autotuning" in n for n in run.plan.notes)
    assert not run.executable.describe().startswith("chosen by")


def test_donated_arguments_are_given_to_the_winner_only() -> None:
    """The candidates are timed on the caller's arrays without donating them; the winner, built to
    donate the parameters as asked, takes them on the first real step."""
    p, x, y = _inputs()
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:2], param_argnums=0, donate_argnums=0, autotune=True,
                               autotune_steps=1)
    want = jax.jit(_step)(p, x, y)
    got = run(p, x, y)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    new_p = run(got[0], x, y)[0]  # the next step from the new parameters runs as well
    assert jax.tree_util.tree_structure(new_p) == jax.tree_util.tree_structure(p)
    # planned as the candidates ran, holding the parameters all step: the memory it predicts is
    # what the timed executables held, and no less than what the donating winner holds
    assert donated_inputs(run.last.lowered.graph) == frozenset()


def test_when_jit_wins_jax_dispatches_the_calls_until_a_new_signature(monkeypatch: Any) -> None:
    """With plain jax.jit chosen, calls go to `jax.jit(fn)` directly (no Python flattening or
    signature check of ours); a call with a new signature is still planned and tuned on its own."""
    monkeypatch.setattr(autotune, "choose", lambda candidates, leaves, steps: next(
        c for c in candidates if c.name == "jit"))
    p, x, y = _inputs()
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:2], param_argnums=0, autotune=True, autotune_steps=1)
    run(p, x, y)
    assert run.last.chosen == "jit" and run._fast is not None
    planned = []
    monkeypatch.setattr(run, "_compile", lambda *a: planned.append(a) or pesto_ir.PestoError("unreachable"))
    for a, b in zip(jax.tree_util.tree_leaves(run(p, x, y)), jax.tree_util.tree_leaves(jax.jit(_step)(p, x, y))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert planned == [] and run.cache_size == 1
    monkeypatch.undo()
    p4, x4, y4 = _inputs(batch=4)
    got = run(p4, x4, y4)  # new shapes: traced by the fast path, refused there, planned anew
    assert run.cache_size == 2 and run._fast is None
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(jax.jit(_step)(p4, x4, y4))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_the_measured_speed_calibrates_the_cluster() -> None:
    """The jit candidate's measured step gives the speed factor s; the calibrated cluster's devices
    are s times slower, so the one-device roofline time of the step equals the measured time."""
    from pesto_ir.cluster.host import machine_of
    from pesto_ir.cost.roofline import graph_time
    from pesto_ir.parallel.autotune import speed_factor

    p, x, y = _inputs()
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:2], param_argnums=0, autotune=True, autotune_steps=1)
    run(p, x, y)
    jit = next(c for c in run.last.candidates if c.name == "jit")
    s = run.last.speed_factor
    assert s is not None and s > 0 and f"speed factor {s:.3g}" in run.report()
    cluster = run.calibrated_cluster(measure_links=False)
    before = Cluster.from_jax_devices(jax.devices()[:2])
    assert cluster.names == before.names and cluster.links == before.links
    assert cluster.calibrated_on == machine_of(jax.devices()[0]), "the speed factor describes this machine"
    assert np.isclose(cluster.devices[1].peak_flops * s, before.devices[1].peak_flops)
    graph = run.compile(p, x, y).lowered.graph
    assert run.last.dispatch is not None and 0 < run.last.dispatch < jit.measured
    assert np.isclose(graph_time(graph, cluster.devices[0]), jit.measured - run.last.dispatch, rtol=1e-6)
    with pytest.raises(pesto_ir.PestoError, match="launch overheads alone"):
        speed_factor(graph, before.devices[0], 1e-9)


def test_no_calibration_without_autotuning() -> None:
    p, x, y = _inputs()
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:2], param_argnums=0, autotune=False)
    run(p, x, y)
    with pytest.raises(pesto_ir.PestoError, match="no measured speed"):
        run.calibrated_cluster()


def _close_to_jit(got: Any, p: Any, x: jax.Array, y: jax.Array) -> None:
    want = jax.jit(_step)(p, x, y)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_the_default_is_measured() -> None:
    """With no options but the devices, the first call times the candidates, so what runs by default
    is never an unmeasured plan; two steps give jax.jit's numbers."""
    assert ParallelizeOptions().autotune == "auto"
    p, x, y = _inputs()
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:4], param_argnums=0, autotune_steps=1)
    got = run(p, x, y)
    _close_to_jit(got, p, x, y)
    _close_to_jit(run(got[0], x, y), got[0], x, y)
    last = run.last
    assert [c.name for c in last.candidates] == ["plan", "jit", "data-parallel"]
    assert last.chosen == autotune.preferred([c for c in last.candidates if c.measured is not None]).name
    assert "| chosen |" in run.report() and "autotune" in last.seconds
    assert any(n.startswith(f"chosen by autotuning: {last.chosen} ") for n in run.plan.notes)
    assert f"chosen by autotuning: {last.chosen} " in run.executable.describe()


@pytest.mark.parametrize("winner, algorithm", [("jit", "jax.jit"), ("plan", "m-etf"),
                                               ("data-parallel", "data-parallel")])
def test_whichever_wins_the_plan_executable_and_report_say_so(monkeypatch: Any, winner: str,
                                                             algorithm: str) -> None:
    """Each candidate made the winner in turn: it computes jax.jit's numbers, `plan.algorithm` names
    it (not the "single" placement that models jax.jit or each replica), the plan's notes, the
    placed graph and `executable.describe()` say it was chosen by autotuning against the others'
    measured steps."""
    real = autotune.choose

    def forced(candidates: list[autotune.Candidate], leaves: Any, steps: int) -> autotune.Candidate:
        real(candidates, leaves, steps)  # measure them all, then pick the one this test wants
        return next(c for c in candidates if c.name == winner)

    monkeypatch.setattr(autotune, "choose", forced)
    p, x, y = _inputs()
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:4], param_argnums=0, autotune_steps=1)
    got = run(p, x, y)
    _close_to_jit(got, p, x, y)
    _close_to_jit(run(got[0], x, y), got[0], x, y)
    assert run.last.chosen == winner and run.plan.algorithm == algorithm
    recorded = read_plan_attrs(run.graph)
    assert recorded is not None and recorded.algorithm == algorithm and recorded.notes == run.plan.notes
    verdict = run.plan.notes[-1]
    assert verdict.startswith(f"chosen by autotuning: {winner} ") and all(
        f"{c.name} (" in verdict for c in run.last.candidates if c.name != winner)
    described = run.executable.describe()
    assert verdict in described
    if winner == "jit":
        exe = run.executable
        assert isinstance(exe, JitExecutable) and described.startswith("plain jax.jit on ")
        assert exe.num_segments == 1 and exe.transfers == [] and list(exe.devices.values()) == [jax.devices()[0]]
        assert run.plan.devices == [exe.name] and len({s.device for s in run.plan.ops.values()}) == 1
        assert "| chosen |" in run.report().splitlines()[3]
    else:
        assert isinstance(run.executable, Executable) and described.startswith(verdict)
        if winner == "data-parallel":
            assert run.plan.parallelism is not None and run.plan.parallelism.data_parallel == 4


def test_jit_is_kept_unless_another_is_clearly_faster() -> None:
    def timed(plan: float, jit: float) -> list[autotune.Candidate]:
        return [autotune.Candidate("plan", "p", None, 1.0, plan), autotune.Candidate("jit", "j", None, 1.0, jit)]

    near = timed(0.98, 1.0)
    assert autotune.preferred(near).name == "jit"
    assert "within 5%" in autotune.verdict(near, near[1])
    assert autotune.preferred(timed(0.90, 1.0)).name == "plan"
    assert autotune.preferred(timed(1.2, 1.0)).name == "jit"
    alone = [autotune.Candidate("plan", "p", None, 1.0, 0.5)]
    assert autotune.preferred(alone).name == "plan" and "the only candidate" in autotune.verdict(alone, alone[0])


def test_the_timed_jax_jit_is_the_one_that_runs() -> None:
    """No donation: the fast path calls the very function the candidate was timed as, compiled then,
    not a second compile of the step."""
    p, x, y = _inputs()
    run = pesto_ir.parallelize(_step, devices=jax.devices()[:2], param_argnums=0, autotune_steps=1)
    run.compile(p, x, y)
    if run.last.chosen != "jit":
        pytest.skip("jax.jit did not win here")
    assert run._fast is run.executable.jitted
    assert run._fast._cache_size() == 1  # compiled while timed
    _close_to_jit(run(p, x, y), p, x, y)
    assert run._fast._cache_size() == 1


@pytest.mark.parametrize("value", ["yes", 1, None, "AUTO"])
def test_autotune_takes_true_false_or_auto(value: Any) -> None:
    with pytest.raises(pesto_ir.PestoError, match=r"autotune must be True, False or \"auto\""):
        pesto_ir.parallelize(_step, autotune=value)


def test_across_processes_auto_plans_and_true_is_refused() -> None:
    """Devices of several processes cannot be timed from one: "auto" (the default) runs the plan,
    True is refused with the reason (tests/test_multiprocess.py runs the default across processes)."""
    assert ParallelizeOptions().tunes(across_processes=False)
    assert not ParallelizeOptions().tunes(across_processes=True)
    assert not ParallelizeOptions(autotune=False).tunes(across_processes=False)
    with pytest.raises(pesto_ir.PestoError, match="one process's devices"):
        ParallelizeOptions(autotune=True).tunes(across_processes=True)
