"""`python -m bench --llm`, the LLM zoo: its rows are the published models and layouts, its MFU is
the stated formula, its mixed-precision step is what it says, and its quick mode runs and reports
every row and column."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import llm_zoo, suite  # noqa: E402
from bench.llm_models import gpt_model, lower_gpt, parameter_count  # noqa: E402
from bench.llm_rows import DGX_H100, P3, ROWS, Layout, quick_row  # noqa: E402
from bench.zoo_jax_models import GptConfig  # noqa: E402

# ---------------------------------------------------------------- the rows are the published numbers

# name: (hidden, layers, heads, seq, vocab, devices, published (DP, TP, PP, micro-batches))
# Alpa: gpt_specs of benchmark/alpa/suite_manual_gpt.py, the p3.16xlarge solutions of
# benchmark/alpa/suite_auto_gpt.py (perf_test_suite; the 8-GPU 2.6B plan's uneven stages as DP2 x PP4)
ALPA = {
    "alpa-gpt-350M": (1024, 24, 16, 1024, 51200, 1, (1, 1, 1, 512)),
    "alpa-gpt-760M": (1536, 24, 16, 1024, 51200, 2, (1, 1, 2, 128)),
    "alpa-gpt-1.3B": (2048, 24, 32, 1024, 51200, 4, (2, 1, 2, 128)),
    "alpa-gpt-2.6B": (2560, 32, 32, 1024, 51200, 8, (2, 1, 4, 128)),
    "alpa-gpt-6.7B": (4096, 32, 32, 1024, 51200, 16, (2, 4, 2, 64)),
    "alpa-gpt-15B": (5120, 48, 40, 1024, 51200, 32, (2, 4, 4, 128)),
    "alpa-gpt-39B": (8192, 48, 64, 1024, 51200, 64, (1, 4, 16, 1024)),
}
# Megatron-Core's H100 table (seq 4096, vocab 131072): TP and PP as published, DP as simulated
MEGATRON = {
    "megatron-gpt-1.7B": (2048, 24, 16, 4096, 131072, 8, (8, 1, 1, 1)),
    "megatron-gpt-7.1B": (4096, 30, 32, 4096, 131072, 8, (4, 2, 1, 1)),
    "megatron-gpt-16B": (6144, 32, 48, 4096, 131072, 8, (2, 4, 1, 1)),
    "megatron-gpt-32B": (7168, 48, 56, 4096, 131072, 16, (2, 8, 1, 1)),
    "megatron-gpt-70B": (8192, 84, 64, 4096, 131072, 32, (2, 8, 2, 4)),
}
PUBLISHED = {**ALPA, **MEGATRON}
# parameters in billions, as the row names say (tied embeddings, learned positions)
SIZE_TOLERANCE = 0.05


def test_the_rows_are_the_published_ones() -> None:
    assert [r.name for r in ROWS] == list(PUBLISHED)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_row_config_matches_the_published_numbers(name: str) -> None:
    hidden, layers, heads, seq, vocab, devices, published = PUBLISHED[name]
    row = next(r for r in ROWS if r.name == name)
    c = row.model
    assert (c.d_model, c.layers, c.heads, c.seq, c.vocab) == (hidden, layers, heads, seq, vocab)
    assert row.devices == devices == row.published.devices
    assert (row.published.dp, row.published.tp, row.published.pp, row.published.microbatches) == published
    # the simulated layout keeps the published degrees, and the batch is DP x micro-batches x micro-batch
    sim = row.simulated
    assert (sim.dp, sim.tp, sim.pp) == published[:3]
    assert c.batch == sim.dp * sim.microbatches * row.micro_batch
    if row.suite == "alpa":
        assert row.machine == P3 and row.published_batch == 1024
        assert row.micro_batch == 1024 // (published[0] * published[3])  # the published micro-batch size
    else:
        assert row.machine == DGX_H100 and row.micro_batch == 1 and sim == row.published
    size = float(name.rsplit("-", 1)[1].replace("B", "e9").replace("M", "e6"))
    assert row.tied == (row.suite == "alpa")  # Megatron's sizes count an output layer of its own
    assert abs(parameter_count(c, row.tied) / size - 1) < SIZE_TOLERANCE, (parameter_count(c, row.tied), size)


def test_the_clusters_are_the_published_machines() -> None:
    p3 = P3.cluster(16)
    assert {d.kind for d in p3.devices} == {"v100"} and p3.devices[0].memory == 16 * 2**30
    assert len(p3.hosts) == 2
    inside, across = p3.link("gpu0", "gpu1"), p3.link("gpu0", "gpu8")
    assert inside.bandwidth == 150e9 and across.bandwidth == 25e9 / 8  # NVLink; 25 Gb/s
    dgx = DGX_H100.cluster(16)
    assert {d.kind for d in dgx.devices} == {"h100"} and dgx.devices[0].memory == 80 * 2**30
    assert dgx.link("gpu0", "gpu8").bandwidth == 400e9 / 8  # one 400 Gb/s NDR port per GPU
    assert len(P3.cluster(4).hosts) == 1


# ---------------------------------------------------------------- MFU

def test_mfu_formula_on_a_hand_computed_case() -> None:
    c = GptConfig(2, 64, 4, 16, 2, 100)
    # N = V d + s d + L (12 d^2 + 13 d) + 2 d = 6400 + 1024 + 2 * (49152 + 832) + 128
    assert parameter_count(c) == 107_520
    # tokens x (6 N + 12 L d s) = 32 x (645,120 + 24,576)
    assert llm_zoo.model_flops(c) == 21_430_272
    # over 1 ms on 2 devices of 1 TFLOP/s
    assert llm_zoo.mfu(21_430_272, 1e-3, 2, 1e12) == pytest.approx(0.010715136)
    assert llm_zoo.mfu(1.0, None, 2, 1e12) is None
    # untied: the output layer's V d more parameters
    assert parameter_count(c, tied=False) == 107_520 + 6400
    assert llm_zoo.model_flops(c, tied=False) == 32 * (6 * 113_920 + 24_576)


def test_parameter_count_is_the_model_s() -> None:
    import jax

    for c in (GptConfig(2, 64, 4, 16, 2, 100), GptConfig(3, 96, 8, 32, 1, 256)):
        for tied in (True, False):
            leaves = jax.tree_util.tree_leaves(gpt_model(c, tied=tied).params)
            assert sum(x.size for x in leaves) == parameter_count(c, tied)


# ---------------------------------------------------------------- the mixed-precision step

def test_the_step_computes_in_bf16_and_keeps_f32_master_weights_and_adam() -> None:
    graph = lower_gpt(GptConfig(1, 32, 4, 16, 2, 64))
    params = [v for v in graph.inputs if v.param]
    assert params and {str(v.type.dtype) for v in params} == {"f32"}
    # the parameters, then Adam's m and v, each a copy of the parameter tree
    assert len(params) % 3 == 0
    matmuls = [op for op in graph.ops if op.opcode == "dot_general"]
    assert {str(op.results[0].type.dtype) for op in matmuls} == {"bf16"}
    assert all(str(v.type.dtype) == "f32" for v in graph.outputs if v.type.shape == ())  # the loss
    new_params = [v for v in graph.outputs if v.type.shape != ()]
    assert {str(v.type.dtype) for v in new_params} == {"f32"} and len(new_params) == len(params)
    f32 = lower_gpt(GptConfig(1, 32, 4, 16, 2, 64), precision="f32")
    assert {str(op.results[0].type.dtype) for op in f32.ops if op.opcode == "dot_general"} == {"f32"}


def test_recomputation_gives_the_same_step_and_holds_less() -> None:
    """Alpa's rows checkpoint every block, as Alpa's suite does; Megatron's checkpoint each
    attention core, as flash attention and selective recomputation hold no scores. Either is the
    same step numerically; recomputing blocks runs each block's forward matmuls again, recomputing
    cores only the scores, and both hold less per-sample memory."""
    import jax
    import numpy as np

    from bench.llm_models import gpt_step
    from bench.zoo_jax import concrete_arguments
    from pesto_ir.passes.placement.search.replica_memory import SAMPLE, ReplicaMemory

    assert {r.remat for r in ROWS if r.suite == "alpa"} == {"blocks"}
    assert {r.remat for r in ROWS if r.suite == "megatron"} == {"attention"}
    c = GptConfig(2, 32, 4, 16, 2, 64)
    plain, args = gpt_step(c, precision="f32")
    values = concrete_arguments(args)
    expected = jax.tree_util.tree_leaves(jax.jit(plain)(*values))
    for mode in ("blocks", "attention"):
        step, _ = gpt_step(c, precision="f32", remat=mode)
        for a, b in zip(expected, jax.tree_util.tree_leaves(jax.jit(step)(*values))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    graphs = [lower_gpt(c, remat=r) for r in ("none", "blocks", "attention")]
    matmuls = [sum(op.opcode == "dot_general" for op in g.ops) for g in graphs]
    # the backward pass needs every matmul's inputs: the qkv projection, both attention einsums,
    # the output projection and the MLP's first layer are recomputed; the MLP's last is not
    assert matmuls[1] == matmuls[0] + 5 * c.layers
    # recomputing a core: the scores (q k^T) again, for the gradient through the softmax, as flash
    # attention's backward pass does; the product with v is not needed again
    assert matmuls[2] == matmuls[0] + c.layers
    walks = [ReplicaMemory.of(g) for g in graphs]
    assert all(w is not None for w in walks)
    peaks = [w.held[:, SAMPLE].max() for w in walks if w is not None]
    assert peaks[1] < peaks[0] and peaks[2] < peaks[0]
    with pytest.raises(ValueError, match="unknown recomputation"):
        lower_gpt(c, remat="some")


def test_quick_rows_are_small_and_keep_every_kind_of_parallelism() -> None:
    quick = [quick_row(r) for r in ROWS]
    assert all(r.devices <= 8 and r.model.d_model == 64 for r in quick)
    assert any(r.simulated.dp > 1 for r in quick) and any(r.simulated.tp > 1 for r in quick)
    assert any(r.simulated.pp > 1 for r in quick)
    assert Layout(2, 4, 2, 64).devices == 16 and str(Layout(2, 4, 2, 64)) == "DP2 TP4 PP2 m64"


# ---------------------------------------------------------------- the quick mode runs

def _run(tmp: Path, *argv: str) -> dict:
    assert suite.main(["--llm", "--quick", "--out", str(tmp), "-q", *argv]) == 0
    return json.loads((tmp / "llm-quick.json").read_text())


def _check_report(tmp: Path, doc: dict, names: list[str]) -> None:
    assert doc["format"] == llm_zoo.FORMAT and doc["quick"] is True
    assert [r["name"] for r in doc["rows"]] == [f"{n}-quick" for n in names]
    table = (tmp / "llm-quick.md").read_text()
    header = "| " + " | ".join(llm_zoo.COLUMNS) + " |"
    assert header in table
    lines = [line for line in table.splitlines() if line.startswith("| ") and line != header]
    assert len(lines) == len(names)
    for line, row in zip(lines, doc["rows"]):
        assert line.count(" | ") == len(llm_zoo.COLUMNS) - 1 and line.startswith(f"| {row['name']} |")
        assert row["lower_bound"] > 0 and row["model_flops"] > 0
        for key in ("pesto", "fixed"):
            result = row[key]
            assert (result["step"] is None) == bool(result["error"] and result["mfu"] is None), result
            if result["step"] is not None:
                assert result["step"] >= row["lower_bound"] * (1 - 1e-9)
                assert result["mfu"] == pytest.approx(llm_zoo.mfu(row["model_flops"], result["step"], row["devices"],
                                                                 1.25e14 if row["suite"] == "alpa" else 9.89e14))


def test_quick_mode_runs_a_few_rows(tmp_path: Path) -> None:
    names = ["alpa-gpt-1.3B", "megatron-gpt-70B"]  # DP x PP; TP x PP
    doc = _run(tmp_path, "--rows", *names, "--time-limit", "5")
    _check_report(tmp_path, doc, names)
    for row in doc["rows"]:
        assert row["pesto"]["step"] is not None and row["pesto"]["fits"] is True
        assert row["fixed"]["step"] is not None and not row["fixed"]["error"]
    # Alpa's published split is its intra-op search's: the faster of Megatron's pairs and the
    # searched layout; Megatron's is its pairs with sequence parallelism, and the searched layout
    # is shown beside it
    assert doc["rows"][1]["fixed"]["strategy"] == "Megatron's pairs, SP"
    searched = doc["rows"][1]["searched"]
    assert searched["strategy"] == "searched" and (searched["step"] is not None or searched["error"])
    assert doc["rows"][0]["searched"] is None  # no TP: one layout


@pytest.mark.slow
def test_quick_mode_runs_every_row(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--time-limit", "0.5")
    _check_report(tmp_path, doc, list(PUBLISHED))


def test_unknown_rows_and_bad_options_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert llm_zoo.main(["--quick", "--rows", "gpt-9000B", "--out", str(tmp_path)]) == 2
    assert "unknown row(s) gpt-9000B" in capsys.readouterr().err
    assert llm_zoo.main(["--quick", "--place", "algo=auto time-limit=3", "--out", str(tmp_path)]) == 2
    with pytest.raises(SystemExit):
        llm_zoo.main(["--time-limit", "0"])
