"""`bench/step_trace.py`: a jitted step's time per op family, measured inside the step."""

from __future__ import annotations

import pytest

from bench.step_trace import family_times, forward_family, instruction_families, parse_hlo

HLO = """HloModule jit_step, entry_computation_layout={(f32[8,8,8,4]{3,2,1,0})->f32[4]{0}}

%add_region (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%fused_conv (p0: f32[8,8,8,4], p1: f32[3,3,4,4]) -> f32[8,8,8,4] {
  %p0 = f32[8,8,8,4]{3,2,1,0} parameter(0)
  %p1 = f32[3,3,4,4]{3,2,1,0} parameter(1)
  %c = f32[8,8,8,4]{3,2,1,0} convolution(%p0, %p1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  ROOT %r = f32[8,8,8,4]{3,2,1,0} maximum(%c, %c)
}

%fused_reduce (p0: f32[8,8,8,4]) -> f32[4] {
  %p0 = f32[8,8,8,4]{3,2,1,0} parameter(0)
  %e = f32[8,8,8,4]{3,2,1,0} exponential(%p0)
  %z = f32[] constant(0)
  ROOT %s = f32[4]{0} reduce(%e, %z), dimensions={0,1,2}, to_apply=%add_region
}

%fused_copy (p0: f32[8,8,8,4]) -> f32[4,8,8,8] {
  %p0 = f32[8,8,8,4]{3,2,1,0} parameter(0)
  ROOT %t = f32[4,8,8,8]{3,2,1,0} transpose(%p0), dimensions={3,0,1,2}
}

ENTRY %main (x: f32[8,8,8,4], w: f32[3,3,4,4]) -> (f32[4], f32[4,8,8,8]) {
  %x = f32[8,8,8,4]{3,2,1,0} parameter(0)
  %w = f32[3,3,4,4]{3,2,1,0} parameter(1)
  %conv_fusion = f32[8,8,8,4]{3,2,1,0} fusion(%x, %w), kind=kOutput, calls=%fused_conv
  %reduce_fusion = f32[4]{0} fusion(%conv_fusion), kind=kInput, calls=%fused_reduce
  %copy_fusion = f32[4,8,8,8]{3,2,1,0} fusion(%conv_fusion), kind=kLoop, calls=%fused_copy
  %neg = f32[4]{0} negate(%reduce_fusion)
  ROOT %out = (f32[4]{0}, f32[4,8,8,8]{3,2,1,0}) tuple(%neg, %copy_fusion)
}
"""


def test_each_entry_instruction_gets_the_family_of_what_it_computes() -> None:
    computations, entry = parse_hlo(HLO)
    assert entry == "main"
    assert [i.opcode for i in computations["main"]] == ["parameter", "parameter", "fusion", "fusion", "fusion",
                                                        "negate", "tuple"]
    assert computations["main"][2].calls == ("fused_conv",)
    assert instruction_families(HLO) == {"conv_fusion": "conv", "reduce_fusion": "reduction",
                                         "copy_fusion": "movement", "neg": "elementwise"}


POOL_GRADIENT = """HloModule jit_pool_grad

%max_region (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%iota_computation () -> s32[4,8] {
  ROOT %i = s32[4,8]{1,0} iota(), iota_dimension=1
}

%broadcast_computation (p0: f32[]) -> f32[4,8] {
  %p0 = f32[] parameter(0)
  ROOT %b = f32[4,8]{1,0} broadcast(%p0), dimensions={}
}

%window_computation (p0: f32[4,8], p1: s32[4,8]) -> (f32[4,4], s32[4,4]) {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = s32[4,8]{1,0} parameter(1)
  ROOT %w = (f32[4,4]{1,0}, s32[4,4]{1,0}) reduce-window(%p0, %p1), window={size=1x2 stride=1x2}, to_apply=%max_region
}

%scatter_computation (p0: f32[4,8], p1: s32[4,4], p2: f32[4,4]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = s32[4,4]{1,0} parameter(1)
  %p2 = f32[4,4]{1,0} parameter(2)
  ROOT %s = f32[4,8]{1,0} scatter(%p0, %p1, %p2), to_apply=%max_region
}

ENTRY %main (x: f32[4,8], dy: f32[4,4]) -> f32[4,8] {
  %x = f32[4,8]{1,0} parameter(0)
  %dy = f32[4,4]{1,0} parameter(1)
  %zero = f32[] constant(0)
  %wrapped_iota = s32[4,8]{1,0} fusion(), kind=kLoop, calls=%iota_computation
  %wrapped_broadcast = f32[4,8]{1,0} fusion(%zero), kind=kLoop, calls=%broadcast_computation
  %wrapped_reduce-window = (f32[4,4]{1,0}, s32[4,4]{1,0}) fusion(%x, %wrapped_iota), kind=kLoop, calls=%window_computation
  %index = s32[4,4]{1,0} get-tuple-element(%wrapped_reduce-window), index=1
  ROOT %wrapped_scatter = f32[4,8]{1,0} fusion(%wrapped_broadcast, %index, %dy), kind=kLoop, calls=%scatter_computation
}
"""


def test_the_thunks_of_an_expanded_max_pool_gradient_count_as_pooling() -> None:
    computations, _ = parse_hlo(POOL_GRADIENT)
    assert computations["main"][5].operands == ("x", "wrapped_iota")
    # the iota feeds the window, the scatter reads the window's indices, the broadcast feeds the scatter
    assert instruction_families(POOL_GRADIENT) == {"wrapped_iota": "window", "wrapped_broadcast": "window",
                                                   "wrapped_reduce-window": "window", "wrapped_scatter": "window"}


def test_a_module_without_an_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="no ENTRY computation"):
        parse_hlo("HloModule m\n\n%f (a: f32[]) -> f32[] {\n  ROOT %a = f32[] parameter(0)\n}\n")


def test_gradient_families_count_in_their_forward_family() -> None:
    assert forward_family("conv_filter_grad") == "conv" and forward_family("matmul_weight_grad") == "matmul"
    assert forward_family("reduction") == "reduction"


def test_a_traced_step_has_its_convolution_and_reduction_time() -> None:
    import jax
    import jax.numpy as jnp

    def step(x: jax.Array, w: jax.Array) -> jax.Array:
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.sum(jnp.exp(y), axis=(0, 1, 2))

    x, w = jnp.ones((4, 16, 16, 8)), jnp.ones((3, 3, 8, 8))
    times = family_times(step, (x, w), runs=3)
    assert times.thunks == {"conv": 1, "reduction": 1}  # XLA:CPU fuses the exp into the reduction
    assert all(t > 0 for t in times.seconds.values())
    assert sum(times.seconds.values()) < 1.0  # per step, not summed over the runs
