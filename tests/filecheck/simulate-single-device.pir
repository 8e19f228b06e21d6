// RUN: pesto-compile %s -p simulate --devices 1 --device-kind h100 -o - 2>&1 | filecheck %s
//
// A graph with no placement at all on a one-device cluster runs on that device in graph order:
// `simulate` alone gives the single-device makespan (2 + 3 + 1 + 0.5 ms), which is also the lower
// bound.

graph @chain() {
  %a = opaque() {cost = 2ms} : blob[1024]
  %b = opaque(%a) {cost = 3ms} : blob[1024]
  %c = opaque(%a) {cost = 1ms} : blob[1024]
  @d opaque(%b, %c) {cost = 500us}
}

// CHECK:      plan for 'chain' (simulate): makespan 6.5 ms, lower bound 6.5 ms, 1.000x
// CHECK:      graph @chain() attributes {plan = {algorithm = "simulate", devices = [@gpu0], makespan = 6.5{{0*[0-9]?}}ms
// CHECK-SAME:   transfers = []} {
// CHECK-NEXT:   %a = opaque() {cost = 2ms, device = @gpu0, start = 0.0s, end = 2ms}
// CHECK-NEXT:   %b = opaque(%a) {cost = 3ms, device = @gpu0, start = 2ms, end = 5ms}
// CHECK-NEXT:   %c = opaque(%a) {cost = 1ms, device = @gpu0, start = 5ms, end = 6ms}
// CHECK-NEXT:   @d opaque(%b, %c) {cost = 500us, device = @gpu0, start = 6ms, end = 6.5{{0*[0-9]?}}ms}
