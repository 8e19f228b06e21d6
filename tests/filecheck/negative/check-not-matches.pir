// RUN: pesto-compile %s -p dce -o - 2>&1 | filecheck %s
//
// Deliberately wrong: dce keeps %used (it is returned), so this CHECK-NOT matches.

graph @f(%x: f32[8,4]) {
  %used = tanh(%x) : f32[8,4]
  return %used
}

// CHECK:     graph @f
// CHECK-NOT: %used
// CHECK:     return
