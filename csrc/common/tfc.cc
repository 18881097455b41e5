#include "common/tfc.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tfmo {

const char* DataTypeName(TF_DataType t) {
  switch (t) {
    case TF_FLOAT: return "float32";
    case TF_DOUBLE: return "float64";
    case TF_HALF: return "float16";
    case TF_BFLOAT16: return "bfloat16";
    case TF_INT32: return "int32";
    case TF_INT64: return "int64";
    case TF_INT16: return "int16";
    case TF_INT8: return "int8";
    case TF_UINT8: return "uint8";
    case TF_UINT16: return "uint16";
    case TF_UINT32: return "uint32";
    case TF_UINT64: return "uint64";
    case TF_BOOL: return "bool";
    case TF_STRING: return "string";
    case TF_COMPLEX64: return "complex64";
    case TF_COMPLEX128: return "complex128";
    default: return "unknown dtype";
  }
}

std::string ShapeString(const TensorRef& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank(); ++i) {
    if (i) s += ", ";
    s += std::to_string(t.dim(i));
  }
  return s + "]";
}

// TF_METAL_OPS_NO_GPU_KERNELS=1 (set by tf_metal_ops before loading the library when the GPU plugin is not
// tensorflow-metal, e.g. the TF >= 2.20 community plugin): GPU kernels are not registered, so TF keeps the ops on
// their CPU kernels instead of placing them on a GPU whose stream the Metal backend cannot drive.
bool GpuKernelsDisabled() {
  const char* v = std::getenv("TF_METAL_OPS_NO_GPU_KERNELS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

void RegisterKernel(const KernelSpec& spec) {
  if (std::strcmp(spec.device, "GPU") == 0 && GpuKernelsDisabled()) return;
  auto register_one = [&](TF_DataType type, bool constrained) {
    TF_KernelBuilder* b = TF_NewKernelBuilder(spec.op, spec.device, spec.create, spec.compute, spec.destroy);
    Status s;
    if (constrained) {
      TF_KernelBuilder_TypeConstraint(b, spec.type_attr, type, s);
      if (!s.ok()) {
        std::fprintf(stderr, "tf_metal_ops: type constraint for %s on %s failed: %s\n", spec.op, spec.device,
                     s.message());
        TF_DeleteKernelBuilder(b);
        return;
      }
    }
    for (const char* name : spec.host_memory) TF_KernelBuilder_HostMemory(b, name);
    // The name is only used in error messages; TF takes ownership of the builder.
    TF_RegisterKernelBuilder(spec.op, b, s);
    if (!s.ok())
      std::fprintf(stderr, "tf_metal_ops: registering the %s kernel of %s failed: %s\n", spec.device, spec.op,
                   s.message());
  };
  if (spec.type_attr == nullptr) {
    register_one(TF_FLOAT, false);
  } else {
    for (TF_DataType t : spec.types) register_one(t, true);
  }
}

void RegisterOp(TF_OpDefinitionBuilder* builder) {
  Status s;
  TF_RegisterOpDefinition(builder, s);  // takes ownership of builder
  if (!s.ok()) std::fprintf(stderr, "tf_metal_ops: registering an op failed: %s\n", s.message());
}

}  // namespace tfmo
