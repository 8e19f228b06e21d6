// RUN: pesto-compile %s -p "microbatch{microbatches=2}" -o - 2>&1 | filecheck %s
// RUN: pesto-compile %s -p "microbatch{microbatches=2 data-parallel=2}" --devices 2 --device-kind h100 -o - 2>&1 \
// RUN:   | filecheck %s --check-prefix=DP
//
// `microbatch` rewrites one replica's training step as M micro-batches: each op that reads
// per-sample data is copied once per micro-batch on its slice of the batch (`.mb0`, `.mb1`, with
// `microbatch = i`, the copies of one op colocated); the weight gradient, which sums over the
// batch, is accumulated across the copies (`.acc1`); the update runs once, on the sum. With
// data-parallel replicas, each replica sees batch/D and the gradient sum is all-reduced.

graph @step(%x: f32[8,4], param %w: f32[4,2]) {
  %h = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[8,2]
  %t = tanh(%h) : f32[8,2]
  %g_w = dot_general(%x, %t) {dimension_numbers = [[[0], [0]], [[], []]]} : f32[4,2]
  %w_new = sub(%w, %g_w) : f32[4,2]
  return %w_new
}

// CHECK:      microbatch: 4 ops -> 10 (data-parallel 1 x 2 micro-batches)
// CHECK:      graph @step(%x: f32[8,4], param %w: f32[4,2]) attributes {batch_inputs = {x = 0}, microbatched = {data_parallel = 1, microbatches = 2}} {
// CHECK-NEXT:   %x.mb0 = slice(%x) {start_indices = [0, 0], limit_indices = [4, 4], {{.*}}microbatch = 0} : f32[4,4]
// CHECK-NEXT:   %x.mb1 = slice(%x) {start_indices = [4, 0], limit_indices = [8, 4], {{.*}}microbatch = 1} : f32[4,4]
// CHECK-NEXT:   %h.mb0 = dot_general(%x.mb0, %w) {{.*}}microbatch = 0, colocate = "h"} : f32[4,2]
// CHECK-NEXT:   %h.mb1 = dot_general(%x.mb1, %w) {{.*}}microbatch = 1, colocate = "h"} : f32[4,2]
// CHECK-NEXT:   %t.mb0 = tanh(%h.mb0) {microbatch = 0, colocate = "t"} : f32[4,2]
// CHECK-NEXT:   %t.mb1 = tanh(%h.mb1) {microbatch = 1, colocate = "t"} : f32[4,2]
// CHECK-NEXT:   %g_w.mb0 = dot_general(%x.mb0, %t.mb0) {{.*}}microbatch = 0, colocate = "g_w"} : f32[4,2]
// CHECK-NEXT:   %g_w.mb1 = dot_general(%x.mb1, %t.mb1) {{.*}}microbatch = 1, colocate = "g_w"} : f32[4,2]
// CHECK-NEXT:   %g_w.acc1 = add(%g_w.mb0, %g_w.mb1) {colocate = "g_w"} : f32[4,2]
// CHECK-NEXT:   %w_new = sub(%w, %g_w.acc1) : f32[4,2]
// CHECK-NEXT:   return %w_new

// One replica's shard is x: f32[4,4], each micro-batch f32[2,4]; the weight stays whole.
// DP:      microbatch: 4 ops -> 11 (data-parallel 2 x 2 micro-batches)
// DP:      graph @step(%x: f32[4,4], param %w: f32[4,2]) attributes {batch_inputs = {x = 0}, microbatched = {data_parallel = 2, microbatches = 2}} {
// DP-NEXT:   %x.mb0 = slice(%x) {{.*}} : f32[2,4]
// DP-NEXT:   %x.mb1 = slice(%x) {{.*}} : f32[2,4]
// DP:        %g_w.acc1 = add(%g_w.mb0, %g_w.mb1) {colocate = "g_w"} : f32[4,2]
// DP-NEXT:   %g_w.allreduce = all_reduce(%g_w.acc1) {reduction = "sum", replicas = 2, colocate = "g_w", cost = {{[0-9.e-]+[mun]?s}}} : f32[4,2]
// DP-NEXT:   %w_new = sub(%w, %g_w.allreduce) : f32[4,2]
// DP-NEXT:   return %w_new
