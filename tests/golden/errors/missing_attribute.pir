graph @g(%x: f32[4,8]) {
  %y = reshape(%x) : f32[32]
  return %y
}
