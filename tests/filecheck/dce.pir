// RUN: pesto-compile %s -p dce -o - 2>&1 | filecheck %s
//
// `dce` removes ops whose results nothing reads, chains of them too (last first), and keeps
// effects (debug_print, debug_callback), graph outputs and what they read. The CHECK-NEXT chain
// leaves no line for %dead or %dead_too.

graph @f(%x: f32[8,4]) {
  %used = tanh(%x) : f32[8,4]
  %dead = neg(%x) : f32[8,4]
  %dead_too = exp(%dead) : f32[8,4]
  @print debug_print(%x) {fmt = "x"}
  %cb = debug_callback(%x) : f32[8,4]
  %out = mul(%used, %used) : f32[8,4]
  %also_out = add(%x, %x) : f32[8,4]
  return %out, %also_out
}

// CHECK:      dce: removed 2 of 7 ops
// CHECK:      graph @f(%x: f32[8,4]) {
// CHECK-NEXT:   %used = tanh(%x) : f32[8,4]
// CHECK-NEXT:   @print debug_print(%x) {fmt = "x"}
// CHECK-NEXT:   %cb = debug_callback(%x) : f32[8,4]
// CHECK-NEXT:   %out = mul(%used, %used) : f32[8,4]
// CHECK-NEXT:   %also_out = add(%x, %x) : f32[8,4]
// CHECK-NEXT:   return %out, %also_out
// CHECK-NEXT: }
