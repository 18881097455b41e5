// Op type names. Convention: the Python function name with a capital first letter ("Zero_out"), so that
// tf.load_op_library(path).zero_out(...) works exactly as in the seed, while the names stay clear of
// TF's own CamelCase ops and of the tensorflow/custom-op example's "ZeroOut".
#pragma once

#define TFMO_OP_ZERO_OUT "Zero_out"
