graph @g(%x: f32[2]) {
  %y = neg(%x) : f32[2], f32[2]
  return %y
}
