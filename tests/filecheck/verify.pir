// RUN: pesto-compile %s -p verify -o - -q | filecheck %s
//
// `verify` checks the IR and changes nothing: the graph prints back op for op, in the printer's
// canonical spelling (quoted names that need no quotes lose them, sizes and durations take their
// largest exact unit, shapes lose their spaces, a label equal to the first result is left out).

graph @"verify_me"(%"x": f32[8, 4], param %w: f32[4,2]) attributes {suggested_cluster = {devices = 2, memory = 16384MiB}} {
  @h %h = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[8,2] loc("model.py":12:5)
  %a = tanh(%h) {cost = 1e3ns, memory = 1024B} : f32[8,2]
  @"odd label" %s = reduce_sum(%a) {axes = [0, 1]} : f32[]
  return %s
}

// CHECK:      graph @verify_me(%x: f32[8,4], param %w: f32[4,2]) attributes {suggested_cluster = {devices = 2, memory = 16GiB}} {
// CHECK-NEXT:   %h = dot_general(%x, %w) {dimension_numbers = {{\[\[\[1\], \[0\]\], \[\[\], \[\]\]\]}}} : f32[8,2] loc("model.py":12:5)
// CHECK-NEXT:   %a = tanh(%h) {cost = 1us, memory = 1KiB} : f32[8,2]
// CHECK-NEXT:   @"odd label" %s = reduce_sum(%a) {axes = [0, 1]} : f32[]
// CHECK-NEXT:   return %s
// CHECK-NEXT: }
// CHECK-NOT:  {{.}}
