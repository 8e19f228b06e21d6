graph @g(%x: blob[2,3]) {
  return %x
}
