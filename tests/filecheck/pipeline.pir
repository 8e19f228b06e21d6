// RUN: pesto-compile %s -p "annotate-costs{model=roofline},coarsen{target=3},place{algo=m-etf},expand,simulate" \
// RUN:   --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s
//
// The whole pipeline on a chain: nothing can run in parallel, so m-ETF keeps every op on one
// device, with no transfers, one op after another, and the plan is as fast as the lower bound.

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
// CHECK-NEXT: coarsen: 6 ops -> 3 groups (target 3)
// CHECK-NEXT: place: candidate (m-etf): [[T:[0-9.]+ [mun]?s]], its strategy's bound [[T]] (simulate times the plan that runs)
// CHECK-NEXT: expand: 6 ops, re-timed with first-come links: [[T]]
// CHECK-NEXT: plan for 'mlp' (m-etf): makespan [[T]], lower bound [[T]], 1.000x
// CHECK-NEXT:   gpu0 (h100): 6 ops
// CHECK-NEXT:   gpu1 (h100): 0 ops
// CHECK:      graph @mlp({{.*}}) attributes {plan = {algorithm = "m-etf", devices = [@gpu0, @gpu1],
// CHECK-SAME:   notes = ["expanded from a coarse plan over 3 groups of 6 ops"]
// CHECK-SAME:   transfers = []} {
// CHECK-NEXT:   %h = dot_general(%x, %w) {{.*}}, device = @gpu0, start = 0.0s, end = [[E1:[0-9.e-]+[mun]?s]]}
// CHECK-NEXT:   %b_row = {{.*}}, device = @gpu0, start = [[E1]], end = [[E2:[0-9.e-]+[mun]?s]]}
// CHECK-NEXT:   %z = {{.*}}, device = @gpu0, start = [[E2]], end = [[E3:[0-9.e-]+[mun]?s]]}
// CHECK-NEXT:   %a = {{.*}}, device = @gpu0, start = [[E3]], end = [[E4:[0-9.e-]+[mun]?s]]}
// CHECK-NEXT:   %o = {{.*}}, device = @gpu0, start = [[E4]], end = [[E5:[0-9.e-]+[mun]?s]]}
// CHECK-NEXT:   %s = {{.*}}, device = @gpu0, start = [[E5]], end = {{[0-9.e-]+[mun]?s}}}
// CHECK-NEXT:   return %s
