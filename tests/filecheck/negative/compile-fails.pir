// RUN: pesto-compile %s -p dce -o - 2>&1 | filecheck %s
//
// Deliberately wrong: the model does not verify, and the RUN line does not say `not`.

graph @f(%x: f32[8,4]) {
  %y = tanh(%x) : f32[8,5]
  return %y
}

// CHECK: error
