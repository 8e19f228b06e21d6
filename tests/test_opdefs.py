"""Op definitions (`pesto_ir/ir/opdefs.py`): one record per opcode, the tables the layers derive
from them, and the analysis annotations kept apart from primitive parameters."""

from __future__ import annotations

import pytest

from pesto_ir.cost import fusion, roofline
from pesto_ir.ir.annotations import ANNOTATIONS, primitive_params
from pesto_ir.ir.attributes import to_attr
from pesto_ir.ir.graph import Graph
from pesto_ir.ir.opdefs import OPDEFS, OpDef, OpDefError, check_kinds, define, opcodes, opdef
from pesto_ir.ir.types import TensorType
from pesto_ir.passes.rewrite import batch_axes


def test_an_opcode_defined_nowhere_is_opaque():
    d = opdef("my_custom_call")
    assert d == OpDef("my_custom_call") and opdef("my_custom_call") is d
    assert (d.shape, d.work, d.family, d.fusion, d.kernel, d.batch, d.run) == (None, None, "other", "none", True,
                                                                               None, None)


def test_definitions_are_checked():
    with pytest.raises(OpDefError, match="defined twice"):
        define("add", shape="binary")
    with pytest.raises(OpDefError, match="work 'fma'"):
        OpDef("x", work="fma")
    with pytest.raises(OpDefError, match="runs no kernel"):
        OpDef("x", kernel=False)
    with pytest.raises(OpDefError, match="has no implementation"):
        check_kinds("work", ["elementwise"])
    assert "x" not in OPDEFS


def test_layers_derive_their_tables_from_the_definitions():
    assert set(roofline.WORK_RULES) == {d.name for d in OPDEFS.values() if d.work is not None}
    assert roofline.WORK_RULES["gather"] is roofline.WORK_KINDS["indexed_read"]
    assert set(batch_axes.BATCH_RULES) == {d.name for d in OPDEFS.values() if d.batch is not None}
    assert batch_axes.BATCH_RULES["argmax"] is batch_axes.BATCH_KINDS["reduce"]
    assert roofline.NO_KERNEL == opcodes(kernel=False) <= fusion.DUPLICATED
    assert not fusion.FUSIBLE & fusion.DUPLICATED
    assert roofline.COLLECTIVES == {"all_reduce", "reduce_scatter", "all_gather"}
    # a copy is elementwise (an epilogue may hold it) and moves data only (a kernel of copies is movement)
    assert "copy" in roofline.ELEMENTWISE_OPS and "copy" in roofline.MOVEMENT_OPS
    assert "convert_element_type" in roofline.ELEMENTWISE_OPS and "convert_element_type" not in roofline.MOVEMENT_OPS
    assert "argmax" in roofline.REDUCTION_OPS and "argmax" not in opcodes(identity_init=True)


def test_primitive_params_leave_the_annotations_out():
    g = Graph("g")
    x = g.add_input("x", TensorType("f32", (4, 2)))
    op = g.add_op("reduce_sum", [x], [TensorType("f32", (2,))],
                  attrs={"axes": to_attr((0,)), "cost": to_attr(1e-6), "device": to_attr("gpu0"), "scope": to_attr("f")})
    assert set(primitive_params(op)) == {"axes"}
    assert {"cost", "device", "scope", "fusion", "microbatch"} <= ANNOTATIONS.keys()
