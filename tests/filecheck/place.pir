// RUN: pesto-compile %s -p "place{algo=m-etf}" --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s --check-prefix=ETF
// RUN: pesto-compile %s -p "place{algo=m-topo}" --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s --check-prefix=TOPO
//
// `place` gives every op a device and a slot (`device`, `start`, `end`) and the graph its plan
// (`plan`, `transfers`). m-ETF (earliest task first) runs %c on the idle second device while %b
// runs, and pays two transfers; m-TOPO fills the first device in topological order up to its
// share of the memory, so this small graph stays on one device, with no transfers. Both keep the
// colocation group "g1" (%b and @d) on one device.

graph @toy() {
  %a = opaque() {cost = 2ms, memory = 1MiB} : blob[4194304]
  %b = opaque(%a) {cost = 3ms, colocate = "g1"} : blob[65536]
  %c = opaque(%a) {cost = 3ms} : blob[1024]
  @d opaque(%b, %c) {cost = 1ms, colocate = "g1"}
}

// ETF:      place: candidate (m-etf):
// ETF:      graph @toy() attributes {plan = {algorithm = "m-etf", devices = [@gpu0, @gpu1], makespan = {{[0-9.]+}}ms, lower_bound = {{[0-9.]+}}ms
// ETF-SAME:   transfers = [{src = "a", from = @gpu0, to = @gpu1, start = 2ms, end = {{[0-9.]+}}ms, bytes = 4194304},
// ETF-SAME:                {src = "c", from = @gpu1, to = @gpu0, start = {{[0-9.]+}}ms, end = {{[0-9.]+}}ms, bytes = 1024}]} {
// ETF-NEXT:   %a = opaque() {cost = 2ms, memory = 1MiB, device = @gpu0, start = 0.0s, end = 2ms} : blob[4194304]
// ETF-NEXT:   %b = opaque(%a) {cost = 3ms, colocate = "g1", device = @gpu0, start = 2ms, end = 5ms} : blob[65536]
// ETF-NEXT:   %c = opaque(%a) {cost = 3ms, device = @gpu1, start = 2.0{{[0-9]+}}ms, end = 5.0{{[0-9]+}}ms} : blob[1024]
// ETF-NEXT:   @d opaque(%b, %c) {cost = 1ms, colocate = "g1", device = @gpu0, start = 5.0{{[0-9]+}}ms, end = 6.0{{[0-9]+}}ms}

// TOPO:      place: candidate (m-topo): 9 ms
// TOPO:      graph @toy() attributes {plan = {algorithm = "m-topo", devices = [@gpu0, @gpu1], makespan = 9{{(\.0+[0-9]*)?}}ms,
// TOPO-SAME:   transfers = []} {
// TOPO-NEXT:   %a = opaque() {{.*}}, device = @gpu0, start = 0.0s, end = 2ms}
// TOPO-NEXT:   %b = opaque(%a) {{.*}}, device = @gpu0, start = 2ms, end = 5ms}
// TOPO-NEXT:   %c = opaque(%a) {{.*}}, device = @gpu0, start = 5ms, end = 8ms}
// TOPO-NEXT:   @d opaque(%b, %c) {{.*}}, device = @gpu0, start = 8ms, end = 9{{(\.0+[0-9]*)?}}ms}
