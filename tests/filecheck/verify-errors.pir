// RUN: not pesto-compile %s -p verify -o - 2>&1 | filecheck %s
//
// Invalid IR is refused before any pass runs, with every finding (not just the first), each as
// file:line:col, the source line and a caret; and no graph is printed.

graph @bad(%x: f32[8,4], param %w: f32[4,2]) {
  %h = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[8,3]
  %y = tanh(%z) : f32[8,2]
  %z = neg(%h) : f32[8,3]
  return %y
}

// CHECK:     verify-errors.pir: the input is not valid IR
// CHECK-DAG: verify-errors.pir:8:8: error: op 'y': uses %z before its definition (by op 'z' at {{.*}}verify-errors.pir:9:8)
// CHECK-DAG: verify-errors.pir:7:8: error: op 'h': result %h is f32[8,3] but dot_general gives f32[8,2]
// CHECK-DAG: verify-errors.pir:8:8: error: op 'y': result %y is f32[8,2] but tanh gives f32[8,3]
// CHECK-NOT: graph @bad
