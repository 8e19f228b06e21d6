graph @g(%x: f32[2]) {
  %y = neg(%z) : f32[2]
  %z = neg(%x) : f32[2]
  return %y
}
