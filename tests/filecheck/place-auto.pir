// RUN: pesto-compile %s -p "place{algo=auto}" --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s
//
// `place{algo=auto}` searches data-parallel replicas x micro-batches x placement. On this chain of
// four ops with parameters (`param_bytes`, so it can be made data-parallel) on two H100s it picks
// pure data parallelism, d=2 m=1: each device runs one replica, the whole chain on half the batch
// (half of each cost), and the four gradients are all-reduced in one bucket at the end. The
// written graph is replica 0's, all on @gpu0; replica 1 mirrors it on @gpu1.
//
// Deterministic: d=2 m=1 is the first strategy screened and the fastest (10 ms / 2 + a ~20 us
// all-reduce); a 1-device plan takes 10 ms and the best pipeline (d=1 m=32) cannot finish before
// its fill, 5 ms + the first micro-batch, so neither a stolen time slice nor the time limit can
// change the choice. Only the strategy and devices are pinned; the "tried ..." list of the note and
// the progress lines on stderr (which strategies were screened before the time limit) are not.

graph @chain() {
  %a = opaque() {cost = 2ms, param_bytes = 4096} : blob[65536]
  %b = opaque(%a) {cost = 3ms, param_bytes = 4096} : blob[65536]
  %c = opaque(%b) {cost = 3ms, param_bytes = 4096} : blob[65536]
  @d opaque(%c) {cost = 2ms, param_bytes = 4096}
}

// CHECK:      place: candidate (auto{{.*}}): {{[0-9.]+}} ms
// CHECK:      graph @chain() attributes {microbatched = {data_parallel = 2, microbatches = 1},
// CHECK-SAME:   plan = {algorithm = "auto", devices = [@gpu0, @gpu1], makespan = {{[0-9.]+}}ms,
// CHECK-SAME:   "hybrid search: chose d=2 m=1 (data-parallel 2 x 1 micro-batches) at {{[0-9.]+}} ms;
// CHECK-SAME:   parallelism = {data_parallel = 2, microbatches = 1, replicas = {{\[\[}}@gpu0], [@gpu1]]}},
// CHECK-SAME:   transfers = [],
// CHECK-SAME:   collectives = [{op = "allreduce.bucket0", kind = "all_reduce", devices = [@gpu0, @gpu1], bytes = 16384,
// CHECK-NEXT:   %a.mb0 = opaque() {cost = 1ms, {{.*}}device = @gpu0, start = 0.0s, end = 1ms} : blob[32768]
// CHECK-NEXT:   %a.grad = opaque(%a.mb0) {{.*}}device = @gpu0
// CHECK-NEXT:   %b.mb0 = opaque(%a.mb0) {cost = 1.5ms, {{.*}}device = @gpu0, start = 1ms, end = 2.5ms} : blob[32768]
// CHECK-NEXT:   %b.grad = opaque(%b.mb0) {{.*}}device = @gpu0
// CHECK-NEXT:   %c.mb0 = opaque(%b.mb0) {cost = 1.5ms, {{.*}}device = @gpu0, start = 2.5ms, end = 4ms} : blob[32768]
// CHECK-NEXT:   %c.grad = opaque(%c.mb0) {{.*}}device = @gpu0
// CHECK-NEXT:   @d.mb0 opaque(%c.mb0) {cost = 1ms, {{.*}}device = @gpu0, start = 4ms, end = 5ms}
// CHECK-NEXT:   %d.grad = opaque({{.*}}device = @gpu0
// CHECK-NEXT:   @allreduce.bucket0 {{.*}} = all_reduce(%a.grad, %b.grad, %c.grad, %d.grad) {replicas = 2, {{.*}}device = @gpu0, start = 5ms,
// CHECK-NEXT:   return %allreduce.bucket0.0, %allreduce.bucket0.1, %allreduce.bucket0.2, %allreduce.bucket0.3
