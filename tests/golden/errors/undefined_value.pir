graph @g(%x: f32[2]) {
  %y = add(%x, %z) : f32[2]
  return %y
}
