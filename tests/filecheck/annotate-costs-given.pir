// RUN: pesto-compile %s -p "annotate-costs{model=given}" --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s
//
// model=given keeps the costs already on the ops (a duration, or a dict keyed by device kind or
// name) and adds nothing: no FLOPs, no bytes, no fusion labels.

graph @toy() {
  %a = opaque() {cost = 2ms, memory = 1MiB} : blob[4194304]
  %b = opaque(%a) {cost = {h100 = 3ms, cpu = 20ms}} : blob[65536]
  @d opaque(%b) {cost = {gpu0 = 1ms, gpu1 = 1500us}}
}

// CHECK-NOT:  warning
// CHECK:      graph @toy() {
// CHECK-NEXT:   %a = opaque() {cost = 2ms, memory = 1MiB} : blob[4194304]
// CHECK-NEXT:   %b = opaque(%a) {cost = {h100 = 3ms, cpu = 20ms}} : blob[65536]
// CHECK-NEXT:   @d opaque(%b) {cost = {gpu0 = 1ms, gpu1 = 1.5ms}}
// CHECK-NEXT: }
