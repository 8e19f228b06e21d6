graph @g(%x: f32[2]) {
  %y = neg(%x) {cost = 1.5 ms} : f32[2]
  return %y
}
