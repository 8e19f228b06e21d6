// RUN: pesto-compile %s -p simulate --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s
//
// `simulate` keeps each op's device and the order of ops on each device (by recorded start, then
// end, then `tie`, then graph order) and re-times the plan with the discrete-event simulator: the stale times below
// (everything at 0) become real ones, the transfers between devices are found, and the plan's
// makespan and lower bound are rewritten. The algorithm's name is kept.

graph @hand() attributes {plan = {algorithm = "by-hand", devices = [@gpu0, @gpu1], makespan = 1ms}} {
  %a = opaque() {cost = 2ms, device = @gpu0, start = 0.0s, end = 0.0s} : blob[1048576]
  %b = opaque(%a) {cost = 3ms, device = @gpu0, start = 0.0s, end = 0.0s} : blob[1024]
  %c = opaque(%a) {cost = 1ms, device = @gpu1, start = 0.0s, end = 0.0s} : blob[1024]
  @d opaque(%b, %c) {cost = 500us, device = @gpu0, start = 0.0s, end = 0.0s}
}

// CHECK:      plan for 'hand' (by-hand): makespan 5.5 ms
// CHECK-NEXT:   gpu0 (h100): 3 ops, busy 5.5 ms
// CHECK-NEXT:   gpu1 (h100): 1 ops, busy 1 ms
// CHECK:      graph @hand() attributes {plan = {algorithm = "by-hand", devices = [@gpu0, @gpu1], makespan = 5.5ms, lower_bound = 5.5ms,
// CHECK-SAME:   transfers = [{src = "a", from = @gpu0, to = @gpu1, start = 2ms, end = 2.0{{[0-9]+}}ms, bytes = 1048576},
// CHECK-SAME:                {src = "c", from = @gpu1, to = @gpu0, start = 3.0{{[0-9]+}}ms, end = 3.0{{[0-9]+}}ms, bytes = 1024}]} {
// CHECK-NEXT:   %a = opaque() {cost = 2ms, device = @gpu0, start = 0.0s, end = 2ms} : blob[1048576]
// CHECK-NEXT:   %b = opaque(%a) {cost = 3ms, device = @gpu0, start = 2ms, end = 5ms} : blob[1024]
// CHECK-NEXT:   %c = opaque(%a) {cost = 1ms, device = @gpu1, start = 2.0{{[0-9]+}}ms, end = 3.0{{[0-9]+}}ms} : blob[1024]
// CHECK-NEXT:   @d opaque(%b, %c) {cost = 500us, device = @gpu0, start = 5ms, end = 5.5ms}
