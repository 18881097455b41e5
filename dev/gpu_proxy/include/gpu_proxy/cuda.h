// The few CUDA spellings the GPU proxy needs, for clang++-16 in CUDA mode without a CUDA installation (-nocudainc
// -nocudalib): the function/variable attributes and the special registers (the __nvvm_read_ptx_sreg_* builtins
// return int). Used by <metal_stdlib>'s CUDA target layer (gpu_proxy/target.h), the generated entry points and the bare
// baselines (dev/gpu_proxy/baselines.cu).
#pragma once

#ifndef __CUDA__
#error "gpu_proxy: compile as CUDA (clang++-16 -x cuda --cuda-device-only ...); see dev/gpu_proxy/build.py"
#endif

// Spelled __x__ inside the attribute: <metal_stdlib> defines `device` and `constant` as macros.
#define __device__ __attribute__((__device__))
#define __global__ __attribute__((__global__))
#define __host__ __attribute__((__host__))
#define __shared__ __attribute__((__shared__))
#define __constant__ __attribute__((__constant__))
#define __launch_bounds__(...) __attribute__((__launch_bounds__(__VA_ARGS__)))

namespace gpu_proxy::sreg {
__device__ inline unsigned tid_x() { return unsigned(__nvvm_read_ptx_sreg_tid_x()); }
__device__ inline unsigned tid_y() { return unsigned(__nvvm_read_ptx_sreg_tid_y()); }
__device__ inline unsigned tid_z() { return unsigned(__nvvm_read_ptx_sreg_tid_z()); }
__device__ inline unsigned ntid_x() { return unsigned(__nvvm_read_ptx_sreg_ntid_x()); }
__device__ inline unsigned ntid_y() { return unsigned(__nvvm_read_ptx_sreg_ntid_y()); }
__device__ inline unsigned ntid_z() { return unsigned(__nvvm_read_ptx_sreg_ntid_z()); }
__device__ inline unsigned ctaid_x() { return unsigned(__nvvm_read_ptx_sreg_ctaid_x()); }
__device__ inline unsigned ctaid_y() { return unsigned(__nvvm_read_ptx_sreg_ctaid_y()); }
__device__ inline unsigned ctaid_z() { return unsigned(__nvvm_read_ptx_sreg_ctaid_z()); }
__device__ inline unsigned nctaid_x() { return unsigned(__nvvm_read_ptx_sreg_nctaid_x()); }
__device__ inline unsigned nctaid_y() { return unsigned(__nvvm_read_ptx_sreg_nctaid_y()); }
__device__ inline unsigned nctaid_z() { return unsigned(__nvvm_read_ptx_sreg_nctaid_z()); }
__device__ inline unsigned laneid() { return unsigned(__nvvm_read_ptx_sreg_laneid()); }
}  // namespace gpu_proxy::sreg
