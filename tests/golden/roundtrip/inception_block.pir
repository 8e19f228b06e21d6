graph @inception_block(%x: f32[8,64,28,28], param %w_1x1: f32[32,64,1,1], param %w_3x3_reduce: f32[48,64,1,1], param %w_3x3: f32[64,48,3,3], param %w_5x5_reduce: f32[8,64,1,1], param %w_5x5: f32[16,8,5,5], param %w_pool_proj: f32[16,64,1,1]) {
  %zero = constant() {value = 0.0} : f32[]
  %b1_conv = conv_general_dilated(%x, %w_1x1) {padding = [[0, 0], [0, 0]], window_strides = [1, 1], lhs_dilation = [1, 1], rhs_dilation = [1, 1], dimension_numbers = {lhs_spec = [0, 1, 2, 3], rhs_spec = [0, 1, 2, 3], out_spec = [0, 1, 2, 3]}, feature_group_count = 1, batch_group_count = 1} : f32[8,32,28,28]
  %b1 = max(%b1_conv, %zero) : f32[8,32,28,28]
  %b2_reduce_conv = conv_general_dilated(%x, %w_3x3_reduce) {padding = [[0, 0], [0, 0]], window_strides = [1, 1], lhs_dilation = [1, 1], rhs_dilation = [1, 1], dimension_numbers = {lhs_spec = [0, 1, 2, 3], rhs_spec = [0, 1, 2, 3], out_spec = [0, 1, 2, 3]}, feature_group_count = 1, batch_group_count = 1} : f32[8,48,28,28]
  %b2_reduce = max(%b2_reduce_conv, %zero) : f32[8,48,28,28]
  %b2_conv = conv_general_dilated(%b2_reduce, %w_3x3) {padding = [[1, 1], [1, 1]], window_strides = [1, 1], lhs_dilation = [1, 1], rhs_dilation = [1, 1], dimension_numbers = {lhs_spec = [0, 1, 2, 3], rhs_spec = [0, 1, 2, 3], out_spec = [0, 1, 2, 3]}, feature_group_count = 1, batch_group_count = 1} : f32[8,64,28,28]
  %b2 = max(%b2_conv, %zero) : f32[8,64,28,28]
  %b3_reduce_conv = conv_general_dilated(%x, %w_5x5_reduce) {padding = [[0, 0], [0, 0]], window_strides = [1, 1], lhs_dilation = [1, 1], rhs_dilation = [1, 1], dimension_numbers = {lhs_spec = [0, 1, 2, 3], rhs_spec = [0, 1, 2, 3], out_spec = [0, 1, 2, 3]}, feature_group_count = 1, batch_group_count = 1} : f32[8,8,28,28]
  %b3_reduce = max(%b3_reduce_conv, %zero) : f32[8,8,28,28]
  %b3_conv = conv_general_dilated(%b3_reduce, %w_5x5) {padding = [[2, 2], [2, 2]], window_strides = [1, 1], lhs_dilation = [1, 1], rhs_dilation = [1, 1], dimension_numbers = {lhs_spec = [0, 1, 2, 3], rhs_spec = [0, 1, 2, 3], out_spec = [0, 1, 2, 3]}, feature_group_count = 1, batch_group_count = 1} : f32[8,16,28,28]
  %b3 = max(%b3_conv, %zero) : f32[8,16,28,28]
  %b4_pool = reduce_window_max(%x) {window_dimensions = [1, 1, 3, 3], window_strides = [1, 1, 1, 1], padding = [[0, 0], [0, 0], [1, 1], [1, 1]], base_dilation = [1, 1, 1, 1], window_dilation = [1, 1, 1, 1]} : f32[8,64,28,28]
  %b4_conv = conv_general_dilated(%b4_pool, %w_pool_proj) {padding = [[0, 0], [0, 0]], window_strides = [1, 1], lhs_dilation = [1, 1], rhs_dilation = [1, 1], dimension_numbers = {lhs_spec = [0, 1, 2, 3], rhs_spec = [0, 1, 2, 3], out_spec = [0, 1, 2, 3]}, feature_group_count = 1, batch_group_count = 1} : f32[8,16,28,28]
  %b4 = max(%b4_conv, %zero) : f32[8,16,28,28]
  %out = concatenate(%b1, %b2, %b3, %b4) {dimension = 1} : f32[8,128,28,28]
  return %out
}
