// RUN: not pesto-compile %s -p dce -o - 2>&1 | filecheck %s
//
// Deliberately wrong: `not` expects a failure, but the model compiles.

graph @f(%x: f32[8,4]) {
  %y = tanh(%x) : f32[8,4]
  return %y
}

// CHECK: graph @f
