// RUN: pesto-compile %s -p "annotate-costs{model=roofline}" --devices 2 --device-kind h100 -o - 2>&1 | filecheck %s
// RUN: pesto-compile %s -p "annotate-costs{model=roofline fusion=none}" --devices 2 --device-kind h100 -o - 2>&1 \
// RUN:   | filecheck %s --check-prefix=NOFUSE
//
// model=roofline writes `cost`, `flops` and `bytes_accessed` on every op from its shapes. With
// fusion=xla (the default) it first groups ops into the kernels XLA would fuse them into, labels
// each op with its kernel (`fusion = "f0"`), and gives each op its share of its kernel's time;
// fusion=none costs every op as its own kernel and writes no label. FLOPs are the op's own either
// way (2*64*128*256 for %h). Bytes are what the op moves to or from memory: alone, everything it
// reads and writes ((64*128 + 128*256 + 64*256) * 4 for %h); in a kernel, the kernel's inputs it
// reads first and the outputs it writes (%h reads %x and %w, 160 KiB; %z works in registers).

graph @mlp(%x: f32[64,128], param %w: f32[128,256], param %b: f32[256], param %w2: f32[256,16]) {
  %h = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[64,256]
  %b_row = broadcast_in_dim(%b) {shape = [64, 256], broadcast_dimensions = [1]} : f32[64,256]
  %z = add(%h, %b_row) : f32[64,256]
  %a = tanh(%z) : f32[64,256]
  %o = dot_general(%a, %w2) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[64,16]
  %s = reduce_sum(%o) {axes = [0, 1]} : f32[]
  return %s
}

// The matmul, its bias and its activation are one kernel; the second matmul and the reduction
// start kernels of their own.
// CHECK:      annotate-costs: roofline costs for 6 ops fused into 3 kernels as XLA would on h100
// CHECK:      graph @mlp(
// CHECK-NEXT:   %h = dot_general(%x, %w)
// CHECK-SAME:     fusion = "f0", cost = {{[0-9.e-]+[mun]?s}}, flops = 4194304, bytes_accessed = 160KiB} : f32[64,256]
// CHECK-NEXT:   %b_row = broadcast_in_dim(%b)
// CHECK-SAME:     fusion = "f0", cost = {{[0-9.e-]+[mun]?s}}, flops = 0, bytes_accessed = 1KiB}
// CHECK-NEXT:   %z = add(%h, %b_row) {fusion = "f0", cost = {{[0-9.e-]+[mun]?s}}, flops = 16384, bytes_accessed = 0B}
// CHECK-NEXT:   %a = tanh(%z) {fusion = "f0", cost = {{[0-9.e-]+[mun]?s}}, flops = 16384, bytes_accessed = 64KiB}
// CHECK-NEXT:   %o = dot_general(%a, %w2)
// CHECK-SAME:     fusion = "f1", cost = {{[0-9.e-]+[mun]?s}}, flops = 524288, bytes_accessed = 84KiB} : f32[64,16]
// CHECK-NEXT:   %s = reduce_sum(%o) {axes = [0, 1], fusion = "f2", cost = {{[0-9.e-]+[mun]?s}}, flops = 1024, bytes_accessed = 4100B} : f32[]
// CHECK-NEXT:   return %s

// NOFUSE:      annotate-costs: roofline costs for 6 ops (each op its own kernel) on h100
// NOFUSE:      graph @mlp(
// NOFUSE-NOT:  fusion =
// NOFUSE:        %h = dot_general(%x, %w)
// NOFUSE-SAME:     {dimension_numbers = {{.*}}, cost = {{[0-9.e-]+[mun]?s}}, flops = 4194304, bytes_accessed = 224KiB} : f32[64,256]
// NOFUSE-NOT:  fusion =
// NOFUSE:        %s = reduce_sum(%o) {axes = [0, 1], cost = {{[0-9.e-]+[mun]?s}}, flops = 1024, bytes_accessed = 4100B} : f32[]
// NOFUSE-NEXT:   return %s
