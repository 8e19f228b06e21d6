graph @g(%x: f32[4,8], %w: f32[8,3]) {
  %y = dot_general(%x, %w) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[4,8]
  return %y
}
