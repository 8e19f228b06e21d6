// RUN: not pesto-compile %s -p "annotate-costs{model=given}" --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s
//
// model=given needs a cost on every op, for every device of the cluster: a missing one is an error
// naming each op (no placement may read a silent 0), and nothing is printed.

graph @toy() {
  %a = opaque() {cost = 2ms} : blob[1024]
  %b = opaque(%a) : blob[1024]
  %c = opaque(%a) {cost = {h100 = 1ms}} : blob[1024]
  @d opaque(%b, %c) {cost = {a100 = 1ms}}
}

// CHECK:      error in pass annotate-costs:
// CHECK-NEXT: error: 2 op(s) lack a usable cost
// CHECK-NEXT:   op 'b' ({{.*}}annotate-costs-given-missing.pir:8:8) has no cost
// CHECK-NEXT:   op 'd' ({{.*}}annotate-costs-given-missing.pir:10:6) has no cost for device gpu0 (kind h100); it has costs for: a100
// CHECK-NOT:  graph @toy
