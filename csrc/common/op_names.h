// Op type names: the single place that spells them (op definitions, CPU and GPU kernel registrations).
//
// Rule (TensorFlow's convention; follow it for every new op): the op type is CamelCase ("HashGridEncodeGradParams"),
// and TensorFlow generates the Python function from it in snake_case (tf.load_op_library(path).
// hash_grid_encode_grad_params, likewise zero_out for ZeroOut). Gradient registrations (tf.RegisterGradient) use
// the op type. These names are stored in every saved graph and SavedModel: never rename an op once released, add a
// new one instead.
//
// No project prefix: op types share one process-wide registry, and none of these names is one of TensorFlow's own
// ops (checked against tf.raw_ops of TF 2.21). The exception to keep in mind is ZeroOut, the name of the
// tensorflow/custom-op example (and of TF's "Create an op" guide): loading that example's library and this one in
// the same process fails with a duplicate op registration. It is the seed's hello-world and nothing else uses it;
// a new op whose name is generic enough to collide (another library's or a future TF op) gets a "Tfmo" prefix.
//
// Families: ops that share their files are listed under a `// family: <family>` line. Every op of a family is
// defined in csrc/ops/<family>_op.cc (through common/shape_fns.h), its host-side argument checks are in
// csrc/ops/<family>_args.h, its kernels in csrc/cpu/*_cpu.cc, csrc/gpu/<family>_gpu.cc and metal_kernels/*.metal,
// its per-element math in csrc/shared/*_math.h, and its Python in tf_metal_ops/ (the files of each family:
// tests/test_op_layout.py). A family whose kernels exist for the CPU only has the line `// kernels: CPU only` right
// under its family line: it has no csrc/gpu/ or metal_kernels/ files, and TensorFlow places its ops on the CPU.
#pragma once

// family: zero_out
#define TFMO_OP_ZERO_OUT "ZeroOut"

// family: render
#define TFMO_OP_VOLUME_RENDER "VolumeRender"
#define TFMO_OP_VOLUME_RENDER_GRAD "VolumeRenderGrad"
#define TFMO_OP_DISTORTION_LOSS "DistortionLoss"
#define TFMO_OP_DISTORTION_LOSS_GRAD "DistortionLossGrad"

// family: hash_grid
#define TFMO_OP_HASH_GRID_ENCODE "HashGridEncode"
#define TFMO_OP_HASH_GRID_ENCODE_GRAD_PARAMS "HashGridEncodeGradParams"
#define TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS "HashGridEncodeGradPositions"
#define TFMO_OP_HASH_GRID_ENCODE_GRAD_POSITIONS_GRAD "HashGridEncodeGradPositionsGrad"

// family: render_packed
#define TFMO_OP_VOLUME_RENDER_PACKED "VolumeRenderPacked"
#define TFMO_OP_VOLUME_RENDER_PACKED_GRAD "VolumeRenderPackedGrad"
#define TFMO_OP_DISTORTION_LOSS_PACKED "DistortionLossPacked"
#define TFMO_OP_DISTORTION_LOSS_PACKED_GRAD "DistortionLossPackedGrad"

// family: ray_march
#define TFMO_OP_RAY_MARCH "RayMarch"

// family: metal_kernel
#define TFMO_OP_METAL_KERNEL "TfmoMetalKernel"  // generic: prefixed (see the rule above)
#define TFMO_OP_METAL_KERNEL_CALL "TfmoMetalKernelCall"  // its eager calls (csrc/ops/metal_kernel_op.cc)

// family: fused_mlp
#define TFMO_OP_FUSED_MLP "FusedMlp"
#define TFMO_OP_FUSED_MLP_GRAD "FusedMlpGrad"
