// RUN: pesto-compile %s -p "annotate-costs{model=roofline},coarsen{target=3}" --devices 2 --device-kind h100 -o - 2>&1 \
// RUN:   | filecheck %s
//
// Ops of one fused kernel (the `fusion` label annotate-costs{fusion=xla} writes) are merged before
// any other edge: XLA runs them as one kernel, so splitting them across devices would send what
// never leaves registers. Three kernels, target 3: one group per kernel.

graph @mlp(%x: f32[64,128], param %w: f32[128,256], param %b: f32[256], param %w2: f32[256,16]) {
  %h = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[64,256]
  %b_row = broadcast_in_dim(%b) {shape = [64, 256], broadcast_dimensions = [1]} : f32[64,256]
  %z = add(%h, %b_row) : f32[64,256]
  %a = tanh(%z) : f32[64,256]
  %o = dot_general(%a, %w2) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[64,16]
  %s = reduce_sum(%o) {axes = [0, 1]} : f32[]
  return %s
}

// CHECK:      annotate-costs: roofline costs for 6 ops fused into 3 kernels
// CHECK:      coarsen: 6 ops -> 3 groups (target 3)
// CHECK:        %h = dot_general(%x, %w) {{.*}}fusion = "f0", {{.*}}group = "[[K0:g[0-9]+]]"}
// CHECK-NEXT:   %b_row = broadcast_in_dim(%b) {{.*}}fusion = "f0", {{.*}}group = "[[K0]]"}
// CHECK-NEXT:   %z = add(%h, %b_row) {fusion = "f0", {{.*}}group = "[[K0]]"}
// CHECK-NEXT:   %a = tanh(%z) {fusion = "f0", {{.*}}group = "[[K0]]"}
// CHECK-NEXT:   %o = dot_general(%a, %w2) {{.*}}fusion = "f1", {{.*}}group = "[[K1:g[0-9]+]]"}
// CHECK-NEXT:   %s = reduce_sum(%o) {{.*}}fusion = "f2", {{.*}}group = "[[K2:g[0-9]+]]"}
