// Host-side parts of ZeroOut (csrc/ops/zero_out_op.cc) shared by the CPU kernel (csrc/cpu/zero_out_cpu.cc) and the
// GPU host code (csrc/gpu/zero_out_gpu.cc): the input check and the kernel registrations.
#pragma once

#include "common/op_names.h"
#include "common/tfc.h"

namespace tfmo::zero_out {

// to_zero: int32, int64, float32 or float16 (the op's type constraint, checked again: eager mode runs no shape
// function, and a kernel must never read a dtype it was not written for).
inline bool CheckInput(TF_OpKernelContext* ctx, const TensorRef& in) {
  const TF_DataType dtype = in.dtype();
  if (dtype == TF_INT32 || dtype == TF_INT64 || dtype == TF_FLOAT || dtype == TF_HALF) return true;
  return Fail(ctx, TF_INVALID_ARGUMENT, "zero_out: to_zero must be int32, int64, float32 or float16, got %s",
              DataTypeName(dtype));
}

// Registers ZeroOut's kernel on `device` for every T.
inline void RegisterKernels(const char* device, void (*compute)(void*, TF_OpKernelContext*)) {
  KernelSpec spec = KernelSpecFor(device);
  spec.op = TFMO_OP_ZERO_OUT;
  spec.compute = compute;
  spec.type_attr = "T";
  spec.types = {TF_INT32, TF_INT64, TF_FLOAT, TF_HALF};
  RegisterKernel(spec);
}

}  // namespace tfmo::zero_out
