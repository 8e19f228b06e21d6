graph @g(%x: f33[2]) {
  return %x
}
