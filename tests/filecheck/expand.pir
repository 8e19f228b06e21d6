// RUN: pesto-compile %s -p expand --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s
//
// A coarse plan (as `coarsen,place` records it) gives every op its group's device and slot: %b and
// @d both show group g2's slot, 5.2ms to 9.2ms. `expand` keeps each op's device and the order on
// each device (groups in the coarse order, a group's ops in graph order), re-times every op on its
// own with the simulator, finds the transfers, and notes that the plan was expanded: %b now runs
// as soon as %a is done, and @d as soon as %c's result arrives.

graph @toy() attributes {plan = {algorithm = "m-etf", devices = [@gpu0, @gpu1], makespan = 9.2ms, notes = ["coarse plan over 3 groups of 4 ops"]}, transfers = []} {
  %a = opaque() {cost = 2ms, memory = 1MiB, group = "g0", device = @gpu0, start = 0.0s, end = 2ms} : blob[4194304]
  %b = opaque(%a) {cost = 3ms, colocate = "layer1", group = "g2", device = @gpu0, start = 5.2ms, end = 9.2ms} : blob[65536]
  %c = opaque(%a) {cost = 3ms, group = "g1", device = @gpu1, start = 2.1ms, end = 5.1ms} : blob[1024]
  @d opaque(%b, %c) {cost = 1ms, colocate = "layer1", group = "g2", device = @gpu0, start = 5.2ms, end = 9.2ms}
}

// CHECK:      expand: 4 ops, re-timed with first-come links: 6.0{{[0-9]*}} ms
// CHECK:      graph @toy() attributes {plan = {algorithm = "m-etf", devices = [@gpu0, @gpu1], makespan = 6.0{{[0-9]+}}ms,
// CHECK-SAME:   notes = ["expanded from a coarse plan over 3 groups of 4 ops"]
// CHECK-SAME:   transfers = [{src = "a", from = @gpu0, to = @gpu1, start = 2ms, end = 2.0{{[0-9]+}}ms, bytes = 4194304},
// CHECK-SAME:                {src = "c", from = @gpu1, to = @gpu0, start = 5.0{{[0-9]+}}ms, end = 5.0{{[0-9]+}}ms, bytes = 1024}]} {
// CHECK-NEXT:   %a = opaque() {{.*}}group = "g0", device = @gpu0, start = 0.0s, end = 2ms}
// CHECK-NEXT:   %b = opaque(%a) {{.*}}group = "g2", device = @gpu0, start = 2ms, end = 5ms}
// CHECK-NEXT:   %c = opaque(%a) {{.*}}group = "g1", device = @gpu1, start = 2.0{{[0-9]+}}ms, end = 5.0{{[0-9]+}}ms}
// CHECK-NEXT:   @d opaque(%b, %c) {{.*}}group = "g2", device = @gpu0, start = 5.0{{[0-9]+}}ms, end = 6.0{{[0-9]+}}ms}
