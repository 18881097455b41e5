// Op type names. Convention: the Python function name with a capital first letter ("Zero_out"), so that
// tf.load_op_library(path).zero_out(...) works exactly as in the seed, while the names stay clear of
// TF's own CamelCase ops and of the tensorflow/custom-op example's "ZeroOut".
#pragma once

#define TFMO_OP_ZERO_OUT "Zero_out"
#define TFMO_OP_VOLUME_RENDER "Volume_render"
#define TFMO_OP_VOLUME_RENDER_GRAD "Volume_render_grad"
#define TFMO_OP_DISTORTION_LOSS "Distortion_loss"
#define TFMO_OP_DISTORTION_LOSS_GRAD "Distortion_loss_grad"
#define TFMO_OP_HASH_GRID_ENCODE "Hash_grid_encode"
#define TFMO_OP_HASH_GRID_ENCODE_GRAD_PARAMS "Hash_grid_encode_grad_params"
#define TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS "Hash_grid_encode_grad_positions"
