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
#define GPU_PROXY_SREG(name) \
  __device__ inline unsigned name() { return unsigned(__nvvm_read_ptx_sreg_##name()); }
GPU_PROXY_SREG(tid_x) GPU_PROXY_SREG(tid_y) GPU_PROXY_SREG(tid_z)
GPU_PROXY_SREG(ntid_x) GPU_PROXY_SREG(ntid_y) GPU_PROXY_SREG(ntid_z)
GPU_PROXY_SREG(ctaid_x) GPU_PROXY_SREG(ctaid_y) GPU_PROXY_SREG(ctaid_z)
GPU_PROXY_SREG(nctaid_x) GPU_PROXY_SREG(nctaid_y) GPU_PROXY_SREG(nctaid_z)
GPU_PROXY_SREG(laneid)
#undef GPU_PROXY_SREG
}  // namespace gpu_proxy::sreg
