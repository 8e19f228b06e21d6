// RUN: pesto-compile %s -p "microbatch{data-parallel=2 optimizer-state=sharded}" --devices 2 --device-kind h100 -o - 2>&1 \
// RUN:   | filecheck %s
//
// Sharded optimizer state (ZeRO-1): with 2 data-parallel replicas, each holds half of the momentum
// %m (rows 0-1 or 2-3, axis 0) and updates that half. The weight gradient is reduce-scattered
// where it would be all-reduced (along axis 1 of %g_wt, which the transpose makes axis 0 of the
// update); the weight is sliced to the replica's rows for the update, and the new weight is
// all-gathered, since the next step's forward pass reads it whole. The new momentum stays sharded
// (`sharded_outputs`); the backend puts the replicas' rows together for the caller.

graph @step(%x: f32[8,4], param %w: f32[4,2], param %m: f32[4,2]) {
  %h = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[8,2]
  %t = tanh(%h) : f32[8,2]
  %g_wt = dot_general(%t, %x) {dimension_numbers = [[[0], [0]], [[], []]]} : f32[2,4]
  %g_w = transpose(%g_wt) {permutation = [1, 0]} : f32[4,2]
  %beta = constant() {value = 0.9} : f32[]
  %lr = constant() {value = 0.1} : f32[]
  %m_old = mul(%beta, %m) : f32[4,2]
  %m_new = add(%m_old, %g_w) : f32[4,2]
  %step = mul(%lr, %m_new) : f32[4,2]
  %w_new = sub(%w, %step) : f32[4,2]
  %loss = reduce_sum(%t) {axes = [0, 1]} : f32[]
  return %w_new, %m_new, %loss
}

// CHECK:      microbatch: 11 ops -> 15 (data-parallel 2 x 1 micro-batches)
// CHECK:      graph @step(%x: f32[4,4], param %w: f32[4,2], param %m: f32[2,2]) attributes {batch_inputs = {x = 0}, microbatched = {data_parallel = 2, microbatches = 1}, sharded_inputs = {m = 0}, sharded_outputs = {"1" = 0}} {
// CHECK:        %g_wt.scatter = reduce_scatter(%g_wt.mb0) {reduction = "sum", replicas = 2, colocate = "g_wt", axes = [1], cost = {{[0-9.e-]+[mun]?s}}} : f32[2,2]
// CHECK-NEXT:   %g_w = transpose(%g_wt.scatter) {permutation = [1, 0]} : f32[2,2]
// CHECK:        %m_old = mul(%beta, %m) : f32[2,2]
// CHECK-NEXT:   %m_new = add(%m_old, %g_w) : f32[2,2]
// CHECK-NEXT:   %step = mul(%lr, %m_new) : f32[2,2]
// CHECK-NEXT:   %w.block = replica_slice(%w) {replicas = 2, axis = 0} : f32[2,2]
// CHECK-NEXT:   %w_new = sub(%w.block, %step) : f32[2,2]
// CHECK-NEXT:   %w_new.gather = all_gather(%w_new) {replicas = 2, axes = [0], cost = {{[0-9.e-]+[mun]?s}}} : f32[4,2]
// CHECK:        %loss.allreduce = all_reduce(%loss.mb0) {reduction = "sum", replicas = 2, colocate = "loss", cost = {{[0-9.e-]+[mun]?s}}} : f32[]
// CHECK-NEXT:   return %w_new.gather, %m_new, %loss.allreduce
