// Thin C++ conveniences over the TensorFlow C API (tensorflow/c/kernels.h, ops.h).
// Only the C API is used anywhere in this project: that is what lets one binary load in every TF >= 2.16.
//
// Conventions:
//  - Kernels validate every input themselves (eager mode does not run shape functions) and report
//    problems with Fail(ctx, code, ...), which surfaces in Python as the matching tf.errors class.
//  - TensorRef owns a TF_Tensor* obtained from TF_GetInput / TF_AllocateOutput and deletes it.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tensorflow/c/kernels.h"
#include "tensorflow/c/ops.h"
#include "tensorflow/c/tf_datatype.h"
#include "tensorflow/c/tf_status.h"
#include "tensorflow/c/tf_tensor.h"

namespace tfmo {

// RAII TF_Status.
class Status {
 public:
  Status() : s_(TF_NewStatus()) {}
  ~Status() { TF_DeleteStatus(s_); }
  Status(const Status&) = delete;
  Status& operator=(const Status&) = delete;
  TF_Status* get() const { return s_; }
  operator TF_Status*() const { return s_; }
  bool ok() const { return TF_GetCode(s_) == TF_OK; }
  TF_Code code() const { return TF_GetCode(s_); }
  const char* message() const { return TF_Message(s_); }

 private:
  TF_Status* s_;
};

// RAII TF_Tensor*.
class TensorRef {
 public:
  TensorRef() = default;
  explicit TensorRef(TF_Tensor* t) : t_(t) {}
  ~TensorRef() { reset(); }
  TensorRef(TensorRef&& o) noexcept : t_(o.t_) { o.t_ = nullptr; }
  TensorRef& operator=(TensorRef&& o) noexcept {
    if (this != &o) { reset(); t_ = o.t_; o.t_ = nullptr; }
    return *this;
  }
  TensorRef(const TensorRef&) = delete;
  TensorRef& operator=(const TensorRef&) = delete;
  void reset() { if (t_) TF_DeleteTensor(t_); t_ = nullptr; }
  TF_Tensor* get() const { return t_; }
  TF_Tensor** out() { reset(); return &t_; }
  TF_Tensor* release() { TF_Tensor* t = t_; t_ = nullptr; return t; }  // the caller deletes it
  explicit operator bool() const { return t_ != nullptr; }

  TF_DataType dtype() const { return TF_TensorType(t_); }
  int rank() const { return TF_NumDims(t_); }
  int64_t dim(int i) const { return TF_Dim(t_, i); }
  int64_t num_elements() const { return TF_TensorElementCount(t_); }
  std::vector<int64_t> shape() const {
    std::vector<int64_t> s(rank());
    for (int i = 0; i < rank(); ++i) s[i] = dim(i);
    return s;
  }
  template <typename T> T* data() const { return static_cast<T*>(TF_TensorData(t_)); }
  void* raw() const { return TF_TensorData(t_); }

 private:
  TF_Tensor* t_ = nullptr;
};

// printf-style message into `status` with `code` (va_list form for the variadic helpers below).
inline void SetStatusV(TF_Status* status, TF_Code code, const char* fmt, va_list ap) {
  char buf[1024];
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  TF_SetStatus(status, code, buf);
}
inline void SetStatus(TF_Status* status, TF_Code code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
inline void SetStatus(TF_Status* status, TF_Code code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  SetStatusV(status, code, fmt, ap);
  va_end(ap);
}

// Fails the op with a printf-style message. Returns false so callers can write `return Fail(...)`.
inline bool Fail(TF_OpKernelContext* ctx, TF_Code code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
inline bool Fail(TF_OpKernelContext* ctx, TF_Code code, const char* fmt, ...) {
  Status s;
  va_list ap;
  va_start(ap, fmt);
  SetStatusV(s, code, fmt, ap);
  va_end(ap);
  TF_OpKernelContext_Failure(ctx, s);
  return false;
}

// Forwards a non-OK status to the op context. Returns status.ok().
inline bool Check(TF_OpKernelContext* ctx, const Status& s) {
  if (s.ok()) return true;
  TF_OpKernelContext_Failure(ctx, s.get());
  return false;
}

inline bool GetInput(TF_OpKernelContext* ctx, int i, TensorRef* t) {
  Status s;
  TF_GetInput(ctx, i, t->out(), s);
  return Check(ctx, s);
}

inline bool AllocateOutput(TF_OpKernelContext* ctx, int i, TF_DataType dtype,
                           const std::vector<int64_t>& shape, TensorRef* t) {
  Status s;
  int64_t elems = 1;
  for (int64_t d : shape) elems *= d;
  *t->out() = TF_AllocateOutput(ctx, i, dtype, shape.data(), static_cast<int>(shape.size()),
                                static_cast<size_t>(elems) * TF_DataTypeSize(dtype), s);
  return Check(ctx, s);
}

// Forwards a non-OK status to the kernel construction. Returns status.ok().
inline bool Check(TF_OpKernelConstruction* c, const Status& s) {
  if (s.ok()) return true;
  TF_OpKernelConstruction_Failure(c, s.get());
  return false;
}

// Attribute readers: fail the op (and return false) when the attr is missing or mistyped.
inline bool GetAttr(TF_OpKernelConstruction* c, const char* name, int64_t* v) {
  Status s;
  TF_OpKernelConstruction_GetAttrInt64(c, name, v, s);
  return Check(c, s);
}
inline bool GetAttr(TF_OpKernelConstruction* c, const char* name, float* v) {
  Status s;
  TF_OpKernelConstruction_GetAttrFloat(c, name, v, s);
  return Check(c, s);
}
inline bool GetAttr(TF_OpKernelConstruction* c, const char* name, bool* v) {
  Status s;
  TF_Bool b = 0;
  TF_OpKernelConstruction_GetAttrBool(c, name, &b, s);
  *v = b != 0;
  return Check(c, s);
}
inline bool GetAttr(TF_OpKernelConstruction* c, const char* name, TF_DataType* v) {
  Status s;
  TF_OpKernelConstruction_GetAttrType(c, name, v, s);
  return Check(c, s);
}
inline bool GetAttr(TF_OpKernelConstruction* c, const char* name, std::string* v) {
  Status s;
  int32_t list_size = 0, total_size = 0;
  TF_OpKernelConstruction_GetAttrSize(c, name, &list_size, &total_size, s);
  if (s.ok()) {
    std::string buf(static_cast<size_t>(total_size), '\0');
    TF_OpKernelConstruction_GetAttrString(c, name, buf.data(), buf.size(), s);
    *v = buf;
  }
  return Check(c, s);
}
inline bool ConstructionFail(TF_OpKernelConstruction* c, TF_Code code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
inline bool ConstructionFail(TF_OpKernelConstruction* c, TF_Code code, const char* fmt, ...) {
  Status s;
  va_list ap;
  va_start(ap, fmt);
  SetStatusV(s, code, fmt, ap);
  va_end(ap);
  return Check(c, s);
}

const char* DataTypeName(TF_DataType t);
std::string ShapeString(const TensorRef& t);

// Argument check of a kernel: true when t has dtype `want`, else fails ctx with InvalidArgument
// "<op>: <name> must be <want>, got <dtype>".
inline bool CheckDtype(TF_OpKernelContext* ctx, const char* op, const char* name, const TensorRef& t,
                       TF_DataType want) {
  if (t.dtype() == want) return true;
  return Fail(ctx, TF_INVALID_ARGUMENT, "%s: %s must be %s, got %s", op, name, DataTypeName(want),
              DataTypeName(t.dtype()));
}

// Registers a kernel for `op` on `device` ("CPU" or "GPU"), optionally constrained on a type attr.
// Registration failures are reported on stderr (there is no context to fail at load time).
struct KernelSpec {
  const char* op;
  const char* device;
  void* (*create)(TF_OpKernelConstruction*) = nullptr;
  void (*compute)(void*, TF_OpKernelContext*) = nullptr;
  void (*destroy)(void*) = nullptr;
  const char* type_attr = nullptr;       // e.g. "T"; nullptr for no constraint
  std::vector<TF_DataType> types;        // one kernel registration per type when type_attr is set
  std::vector<const char*> host_memory;  // input/output names kept in host memory (GPU kernels)
};
void RegisterKernel(const KernelSpec& spec);

// A spec with only the device set ("CPU" or "GPU").
inline KernelSpec KernelSpecFor(const char* device) {
  KernelSpec spec{};
  spec.device = device;
  return spec;
}

// Registers the kernels of an op and of its gradient op: `spec` (device, kernel state, ...) with each op's compute.
inline void RegisterKernelPair(KernelSpec spec, const char* op, void (*compute)(void*, TF_OpKernelContext*),
                               const char* grad_op, void (*grad_compute)(void*, TF_OpKernelContext*)) {
  spec.op = op;
  spec.compute = compute;
  RegisterKernel(spec);
  spec.op = grad_op;
  spec.compute = grad_compute;
  RegisterKernel(spec);
}

// Registers an op definition built by `build`; reports failures on stderr.
void RegisterOp(TF_OpDefinitionBuilder* builder);

}  // namespace tfmo

namespace tfmo {
// Runs fn once at library load time (op and kernel registration):
//   static const tfmo::OnLoad kRegister([] { ... });
struct OnLoad {
  explicit OnLoad(void (*fn)()) { fn(); }
};
}  // namespace tfmo
