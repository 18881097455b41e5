// GPU host layer, backend-neutral: what every op's GPU host code (csrc/gpu/<op>_gpu.cc) uses to validate, allocate
// and describe its passes. One backend per build executes the description:
//   - Metal (csrc/metal/*.mm, macOS): tensorflow-metal's stream, one compute encoder, one commit;
//   - emulated (csrc/emulated_gpu/direct_backend.cc, any OS): the Metal-emulating TF device, kernels run by csrc/msl_emu.
// Conventions: docs/metal_host.md.
//
//   tfmo::gpu::Call call(ctx, "zero_out");
//   call.pass("zero_out_float32").buffer(0, in).buffer(1, out).value<uint32_t>(2, n).threads(n);
//   call.Run();   // false after failing ctx with a message
//
// Invariants:
//  - A Call is one op invocation: all its passes go into one compute encoder in order (each pass sees the
//    previous passes' writes) and are committed once. Nothing waits for the GPU unless TF_METAL_OPS_SYNC=1.
//  - Tensors bound to a pass are borrowed: the op keeps its TensorRefs alive until Run() returns (TF keeps device
//    memory valid for work already enqueued on the stream). Scratch buffers belong to the Call and are released
//    only after the GPU has finished the call's work.
//  - Binding an empty tensor is an error (Metal has no buffer for it): skip passes that have no work, or bind a
//    non-empty stand-in the kernel will not touch. A pass whose grid has a zero dimension is skipped.
//  - Errors never abort: the first one is kept and Run() reports it through TF_OpKernelContext_Failure.
//  - Kernel parameters at [[buffer(n)]] must match what is bound at slot n (element type, size); the emulated
//    backend checks this for every dispatch, Metal does not.
//  - Data-dependent output sizes (e.g. RayMarch's sample count): Call::RunAndRead runs the passes so far, waits for
//    the GPU and copies a few bytes of a device tensor to the host; later passes go to the next Run(). It is the
//    only place the host waits (without TF_METAL_OPS_SYNC=1) and stalls the stream: use it at most once per op.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/tfc.h"

namespace tfmo::gpu {

constexpr uint32_t kMaxBufferSlots = 31;  // [[buffer(0..30)]]
constexpr size_t kMaxBytes = 4096;        // setBytes limit
constexpr size_t kMaxReadBytes = 4096;    // Call::RunAndRead limit
constexpr size_t kReadAlignment = 4;      // Call::RunAndRead offset and size (macOS blit copies need multiples of 4)

// Function-constant values for one pipeline, by index ([[function_constant(i)]] in MSL). Setting an index twice
// keeps the last value. Part of the pipeline cache key.
class Specialization {
 public:
  enum class Type : uint8_t { kInt, kUInt, kBool, kFloat };
  struct Constant {
    uint32_t index;
    Type type;
    uint32_t bits;  // the value's 32-bit pattern (bool: 0/1)
    bool operator==(const Constant& o) const { return index == o.index && type == o.type && bits == o.bits; }
  };

  Specialization& Int(uint32_t index, int32_t v);
  Specialization& UInt(uint32_t index, uint32_t v);
  Specialization& Bool(uint32_t index, bool v);
  Specialization& Float(uint32_t index, float v);

  bool empty() const { return constants_.empty(); }
  const std::vector<Constant>& constants() const { return constants_; }  // sorted by index
  std::string Key() const;                                               // canonical text, "" when empty

 private:
  Specialization& Set(uint32_t index, Type type, uint32_t bits);
  std::vector<Constant> constants_;
};

// A pass's own Metal source (inline kernels, tf_metal_ops.metal_kernel): the complete MSL defining the pass's
// function. Backends compile it at first use and cache the result by the text (Metal: newLibraryWithSource; the
// emulated GPU: csrc/common/inline_library.h). The op keeps it alive until Run() returns.
struct KernelSource {
  std::string msl;
};

// What one buffer slot of a pass holds.
struct Binding {
  enum class Kind : uint8_t { kNone, kTensor, kBytes };
  Kind kind = Kind::kNone;
  TF_Tensor* tensor = nullptr;  // kTensor: device memory (TF_TensorData is backend-specific)
  TF_DataType dtype = TF_FLOAT;  // kTensor: element type
  size_t size = 0;               // bytes of the tensor or of the data
  std::vector<unsigned char> data;  // kBytes: a copy
};

class Call;

// One kernel dispatch: function, specialisation, slots, grid. Build it through Call::pass(); the setters return
// *this so a pass reads as one statement.
class Pass {
 public:
  enum class Grid : uint8_t { kNone, kThreads, kThreadgroups };

  Pass& buffer(uint32_t slot, const TensorRef& t);
  Pass& bytes(uint32_t slot, const void* data, size_t length);  // 1..4096 bytes, copied
  template <class T>
  Pass& value(uint32_t slot, const T& v) {
    static_assert(std::is_trivially_copyable<T>::value, "value<T>: T must be trivially copyable");
    return bytes(slot, &v, sizeof(T));
  }
  Pass& threadgroup_memory(uint32_t slot, size_t length);  // [[threadgroup(slot)]], rounded up to 16 bytes

  // dispatchThreads: one thread per grid point; `group` = threads per threadgroup, 0 = the backend's default
  // (a multiple of the SIMD width), clamped to the pipeline's maximum. Each dimension must fit in 32 bits.
  Pass& threads(uint64_t n, uint32_t group = 0);
  Pass& threads(std::array<uint64_t, 3> grid, std::array<uint32_t, 3> group = {0, 0, 0});
  // dispatchThreadgroups: whole groups of exactly `group` threads (kernels with barriers / threadgroup memory).
  Pass& threadgroups(std::array<uint64_t, 3> groups, std::array<uint32_t, 3> group);

  const std::string& function() const { return function_; }
  const KernelSource* source() const { return source_; }  // null: the package's kernel library
  const Specialization& specialization() const { return spec_; }
  const std::array<Binding, kMaxBufferSlots>& buffers() const { return buffers_; }
  const std::array<size_t, kMaxBufferSlots>& threadgroup_lengths() const { return tg_lengths_; }
  Grid grid_kind() const { return grid_kind_; }
  const std::array<uint64_t, 3>& grid() const { return grid_; }    // threads, or groups
  const std::array<uint32_t, 3>& group() const { return group_; }  // 0 = backend default (threads only)
  bool empty() const;  // a zero dimension: nothing to dispatch

 private:
  friend class Call;
  Pass(Call* call, std::string function, Specialization spec, const KernelSource* source)
      : call_(call), function_(std::move(function)), spec_(std::move(spec)), source_(source) {}
  bool CheckSlot(uint32_t slot, const char* what);

  Call* call_;
  std::string function_;
  Specialization spec_;
  const KernelSource* source_;
  std::array<Binding, kMaxBufferSlots> buffers_{};
  std::array<size_t, kMaxBufferSlots> tg_lengths_{};
  Grid grid_kind_ = Grid::kNone;
  std::array<uint64_t, 3> grid_{0, 0, 0};
  std::array<uint32_t, 3> group_{0, 0, 0};
};

// One op invocation on the GPU: scratch buffers and passes, executed by the build's backend.
class Call {
 public:
  Call(TF_OpKernelContext* ctx, const char* op) : ctx_(ctx), op_(op) {}
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // A device buffer of `elements` values for this call only, released after the GPU finished the call.
  // Returns nullptr after recording the error (Run() then reports it).
  const TensorRef* scratch(TF_DataType dtype, int64_t elements);
  // Appends a pass (kept in order). The reference stays valid for the Call's lifetime. `source`: the function's
  // own MSL (inline kernels), else the package's kernel library.
  Pass& pass(const char* function, Specialization spec = {}, const KernelSource* source = nullptr);
  // Validates and hands the passes to the backend: one encoder, one commit. Returns false after failing ctx.
  bool Run();
  // Runs the passes added so far (one encoder), commits and waits until the GPU has finished them, then copies
  // `bytes` (1..kMaxReadBytes) bytes at byte `offset` (both multiples of kReadAlignment) of device tensor t (an output or a scratch buffer of this
  // Call) into host memory `out`. The executed passes are dropped; passes added afterwards run at the next Run() or
  // RunAndRead(); scratch buffers stay with the Call. Returns false after failing ctx (the GPU's failure included).
  bool RunAndRead(const TensorRef& t, size_t offset, void* out, size_t bytes);

  // Records an error (the first wins); Run() fails ctx with it.
  void fail(TF_Code code, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  bool ok() const { return code_ == TF_OK; }

  // For backends.
  TF_OpKernelContext* ctx() const { return ctx_; }
  const char* op() const { return op_; }
  const std::vector<std::unique_ptr<Pass>>& passes() const { return passes_; }
  // Hands the scratch tensors to the backend, which deletes them (TF_DeleteTensor) once the GPU is done.
  std::vector<TF_Tensor*> TakeScratch();

 private:
  bool CheckPasses();  // false after failing ctx

  TF_OpKernelContext* ctx_;
  const char* op_;
  std::vector<std::unique_ptr<TensorRef>> scratch_;
  std::vector<std::unique_ptr<Pass>> passes_;
  TF_Code code_ = TF_OK;
  std::string error_;
};

// Threads per threadgroup for a dispatchThreads pass: `group` with zeros replaced by the default (x: a multiple of
// `width` up to 256 for 1-D grids, else `width`; y: what fits under `max_threads`; z: 1), clipped to the grid and
// shrunk (z, then y, then x) until the product is at most `max_threads`. Both backends use it.
std::array<uint32_t, 3> ResolveGroup(const std::array<uint64_t, 3>& grid, std::array<uint32_t, 3> group,
                                     uint32_t max_threads, uint32_t width);

// Fails ctx unless n fits in a 32-bit grid dimension / kernel index; `what` names the quantity in the message.
bool CheckGridSize(TF_OpKernelContext* ctx, const char* op, const char* what, uint64_t n);

// Implemented by the build's backend: whether the device holding tensor `t` adds floats atomically in hardware as the
// package's kernels are compiled for it (atomic_float, MSL >= 3.0). Where false, a float atomic add is a
// compare-and-swap loop (MSL 2.4) several times slower under contention (bench/gpu_proxy.md, latest-run table: the
// "CAS loop" rows): an op whose scatter has an integer-atomic form runs that instead. Returns false after recording
// an error in `call` (Run() reports it) when t's device cannot be told.
bool NativeFloatAtomics(Call& call, const TensorRef& t);

// Implemented by the build's backend: executes call.passes() on the device of call.ctx() (the passes are already
// validated by Call::Run). Returns false after failing ctx.
bool Execute(Call& call);

// A host read-back of Call::RunAndRead: `bytes` bytes at byte `offset` of the device tensor `tensor` -> `out`
// (host memory, valid until ExecuteAndRead returns). Checked by RunAndRead: the range lies inside the tensor.
struct HostRead {
  TF_Tensor* tensor = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
  void* out = nullptr;
};

// Implemented by the build's backend: encodes call.passes() as Execute does, then the copy of `read` after them in
// the same command buffer, commits, waits for completion and fills read.out. Leaves the scratch tensors with the
// Call (the GPU is done with them when this returns). Returns false after failing ctx.
bool ExecuteAndRead(Call& call, const HostRead& read);

}  // namespace tfmo::gpu
