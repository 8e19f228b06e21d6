graph @g(%x: f32[2]) {
  %y = neg(%x) {mode = fast} : f32[2]
  return %y
}
