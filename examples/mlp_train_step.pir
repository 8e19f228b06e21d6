// A two-layer MLP training step: forward pass, mean squared error, backward pass and an
// SGD update (learning rate 0.1). Batch 64, 784 -> 256 -> 10, ReLU.
// The parameters are marked `param`: they are trainable state that placement keeps resident.
graph @mlp_train_step(%x: f32[64,784], %y: f32[64,10], param %w1: f32[784,256], param %b1: f32[256], param %w2: f32[256,10], param %b2: f32[10]) {
  // ---- forward
  %h_mm = dot_general(%x, %w1) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[64,256]
  %b1_row = broadcast_in_dim(%b1) {shape = [64, 256], broadcast_dimensions = [1]} : f32[64,256]
  %h = add(%h_mm, %b1_row) : f32[64,256]
  %zero = constant() {value = 0.0} : f32[]
  %a = max(%h, %zero) : f32[64,256]
  %o_mm = dot_general(%a, %w2) {dimension_numbers = [[[1], [0]], [[], []]]} : f32[64,10]
  %b2_row = broadcast_in_dim(%b2) {shape = [64, 10], broadcast_dimensions = [1]} : f32[64,10]
  %o = add(%o_mm, %b2_row) : f32[64,10]
  // ---- loss = mean((o - y)^2)
  %d = sub(%o, %y) : f32[64,10]
  %sq = mul(%d, %d) : f32[64,10]
  %sq_sum = reduce_sum(%sq) {axes = [0, 1]} : f32[]
  %inv_n = constant() {value = 0.0015625} : f32[]
  %loss = mul(%sq_sum, %inv_n) : f32[]
  // ---- backward
  %two_inv_n = constant() {value = 0.003125} : f32[]
  %g_o = mul(%d, %two_inv_n) : f32[64,10]
  %g_w2 = dot_general(%a, %g_o) {dimension_numbers = [[[0], [0]], [[], []]]} : f32[256,10]
  %g_b2 = reduce_sum(%g_o) {axes = [0]} : f32[10]
  %g_a = dot_general(%g_o, %w2) {dimension_numbers = [[[1], [1]], [[], []]]} : f32[64,256]
  %active = gt(%h, %zero) : bool[64,256]
  %zeros = broadcast_in_dim(%zero) {shape = [64, 256], broadcast_dimensions = []} : f32[64,256]
  %g_h = select_n(%active, %zeros, %g_a) : f32[64,256]
  %g_w1 = dot_general(%x, %g_h) {dimension_numbers = [[[0], [0]], [[], []]]} : f32[784,256]
  %g_b1 = reduce_sum(%g_h) {axes = [0]} : f32[256]
  // ---- SGD update
  %lr = constant() {value = 0.1} : f32[]
  %step_w1 = mul(%g_w1, %lr) : f32[784,256]
  %w1_new = sub(%w1, %step_w1) : f32[784,256]
  %step_b1 = mul(%g_b1, %lr) : f32[256]
  %b1_new = sub(%b1, %step_b1) : f32[256]
  %step_w2 = mul(%g_w2, %lr) : f32[256,10]
  %w2_new = sub(%w2, %step_w2) : f32[256,10]
  %step_b2 = mul(%g_b2, %lr) : f32[10]
  %b2_new = sub(%b2, %step_b2) : f32[10]
  return %loss, %w1_new, %b1_new, %w2_new, %b2_new
}
