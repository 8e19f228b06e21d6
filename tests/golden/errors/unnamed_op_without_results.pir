graph @g(%x: f32[2]) {
  barrier(%x)
}
