// RUN: pesto-compile %s -p dce -o - 2>&1 | filecheck %s
//
// Deliberately wrong: a RUN line but no check lines, which must not pass as an empty test.

graph @f(%x: f32[8,4]) {
  %used = tanh(%x) : f32[8,4]
  return %used
}
