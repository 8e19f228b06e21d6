// RUN: pesto-compile %s -p dce -o - 2>&1 | filecheck %s
//
// A graph that returns nothing (a cost graph: its sinks are its work) is left alone.

graph @costs() {
  %a = opaque() {cost = 2ms} : blob[1024]
  %sink = opaque(%a) {cost = 3ms} : blob[1024]
}

// CHECK: dce: the graph returns nothing (a cost graph's sinks are its work): nothing removed
// CHECK: %a = opaque()
// CHECK: %sink = opaque(%a)
