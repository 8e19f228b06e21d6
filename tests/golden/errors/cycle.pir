graph @g(%x: f32[2]) {
  %a = add(%x, %c) : f32[2]
  %b = neg(%a) : f32[2]
  %c = neg(%b) : f32[2]
  return %c
}
