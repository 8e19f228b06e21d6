graph @g(%x: f32[2]) {
  @n %a = neg(%x) : f32[2]
  @n %b = neg(%x) : f32[2]
  return %b
}
