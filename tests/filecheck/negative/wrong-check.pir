// RUN: pesto-compile %s -p dce -o - 2>&1 | filecheck %s
//
// Deliberately wrong: dce removes %dead, so this check cannot match.

graph @f(%x: f32[8,4]) {
  %used = tanh(%x) : f32[8,4]
  %dead = neg(%x) : f32[8,4]
  return %used
}

// CHECK: %used = tanh(%x)
// CHECK: %dead = neg(%x)
