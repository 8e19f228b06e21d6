// RUN: pesto-compile %s -p coarsen --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s
// RUN: pesto-compile %s -p "coarsen{target=2}" --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s --check-prefix=T2
// RUN: pesto-compile %s -p "coarsen{target=1}" --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s --check-prefix=T1
//
// `coarsen` only writes a `group` on every op (the fine graph stays the pipeline's graph). A
// colocation group is contracted first, even when the target leaves room for every op alone; then
// edges are contracted until at most `target` groups are left.

graph @toy() {
  %a = opaque() {cost = 2ms, memory = 1MiB} : blob[4194304]
  %b = opaque(%a) {cost = 3ms, colocate = "layer1"} : blob[65536]
  %c = opaque(%a) {cost = 3ms} : blob[1024]
  @d opaque(%b, %c) {cost = 1ms, colocate = "layer1"}
}

// CHECK:      coarsen: 4 ops -> 3 groups (target 200)
// CHECK:      graph @toy() {
// CHECK-NEXT:   %a = opaque() {cost = 2ms, memory = 1MiB, group = "[[A:g[0-9]+]]"} : blob[4194304]
// CHECK-NEXT:   %b = opaque(%a) {cost = 3ms, colocate = "layer1", group = "[[BD:g[0-9]+]]"} : blob[65536]
// CHECK-NEXT:   %c = opaque(%a) {cost = 3ms, group = "[[C:g[0-9]+]]"} : blob[1024]
// CHECK-NEXT:   @d opaque(%b, %c) {cost = 1ms, colocate = "layer1", group = "[[BD]]"}
// CHECK-NEXT: }

// T2:      coarsen: 4 ops -> 2 groups (target 2)
// T2:        %a = opaque() {{.*}}group = "[[AC:g[0-9]+]]"}
// T2-NEXT:   %b = opaque(%a) {{.*}}group = "[[BD:g[0-9]+]]"}
// T2-NEXT:   %c = opaque(%a) {{.*}}group = "[[AC]]"}
// T2-NEXT:   @d opaque(%b, %c) {{.*}}group = "[[BD]]"}

// T1:      coarsen: 4 ops -> 1 groups (target 1)
// T1:        %a = opaque() {{.*}}group = "[[G:g[0-9]+]]"}
// T1-NEXT:   %b = opaque(%a) {{.*}}group = "[[G]]"}
// T1-NEXT:   %c = opaque(%a) {{.*}}group = "[[G]]"}
// T1-NEXT:   @d opaque(%b, %c) {{.*}}group = "[[G]]"}
