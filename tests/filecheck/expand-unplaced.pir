// RUN: not pesto-compile %s -p expand --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s
//
// `expand` needs a plan to expand.

graph @toy() {
  %a = opaque() {cost = 2ms} : blob[1024]
}

// CHECK:     expand needs a placed graph: run place before it
// CHECK-NOT: graph @toy
