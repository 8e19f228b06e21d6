graph @g(%x: f32[2]) {
  %y = neg(%x) {k = 1, k = 2} : f32[2]
  return %y
}
