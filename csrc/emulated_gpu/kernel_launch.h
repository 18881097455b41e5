// Runs a Metal kernel of metal_kernels/*.metal by name on the CPU (csrc/msl_emu), after checking that what the
// host bound fits the kernel's signature: the binding contract that a real Metal driver would leave to chance.
// Plain C++ (no TensorFlow, no msl_emu types), so the direct backend can include it beside the TF C API;
// kernel_launch.cc and the generated per-file glue (tf_metal_ops/msl_emu.py) are compiled with msl_emu.
//
// The contract (checked by CheckLaunch and again by Launch; a violation is an error message, never a crash):
//  - every [[buffer(n)]] parameter of the kernel has slot n bound, and no other slot is bound;
//  - a pointer parameter whose pointee is a scalar or vector type (float, half, int, uint, atomic_float, float4, ...)
//    gets a buffer of exactly that scalar type (a float32 tensor bound to `device const half*` is an error) whose
//    size is a multiple of the pointee's size; a struct pointee takes any buffer whose size is such a multiple;
//  - `constant T& x [[buffer(n)]]` takes bytes of exactly sizeof(T) (or a buffer of at least that size);
//  - bytes (setBytes data) are read-only: never bound to a non-const `device` pointer;
//  - every [[threadgroup(n)]] parameter has a threadgroup memory length set (1 .. 32 KiB in all), and only those;
//  - the specialisation gives every [[function_constant(n)]] of the kernel's source file a value of the declared type
//    (bool/int/uint/float), and nothing else;
//  - grids: each dimension of the grid (threads) or of the group count (threadgroups) in 1 .. 2^32-1, threads per
//    group in 1 .. 1024 (threadgroup sizes are given explicitly: the caller resolves defaults).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tfmo::emu {

constexpr uint32_t kMaxBufferSlots = 31;        // [[buffer(0..30)]]
constexpr uint32_t kMaxThreadgroupSlots = 31;   // [[threadgroup(0..30)]]
constexpr size_t kMaxThreadgroupMemory = 32768; // Apple GPUs: 32 KiB per threadgroup
constexpr uint32_t kMaxThreadsPerGroup = 1024;
constexpr uint32_t kExecutionWidth = 32;        // threadExecutionWidth reported to hosts

struct SlotBinding {
  enum class Kind : uint8_t { kNone, kBuffer, kBytes };
  Kind kind = Kind::kNone;
  const char* scalar = nullptr;  // kBuffer: MSL scalar name of the elements ("float", "half", "int", "uint",
                                 // "long", "ulong", "short", "ushort", "char", "uchar", "bool")
  size_t bytes = 0;              // size of the buffer or of the bytes
  void* data = nullptr;          // Launch only: host address of the buffer / bytes (bytes: 16-byte aligned)
  bool writable = true;          // kBuffer: false for inputs the op must not write (informational)
};

struct ConstantValue {
  uint32_t index = 0;
  char type = 'u';  // 'b' bool, 'i' int, 'u' uint, 'f' float
  uint32_t bits = 0;
};

struct LaunchDesc {
  const char* kernel = nullptr;
  SlotBinding buffers[kMaxBufferSlots];
  size_t threadgroup_memory[kMaxThreadgroupSlots] = {};  // 0 = not set
  std::vector<ConstantValue> constants;                  // sorted by index, unique
  bool threadgroups = false;  // false: dispatchThreads(grid = threads); true: dispatchThreadgroups(grid = groups)
  uint64_t grid[3] = {1, 1, 1};
  uint32_t group[3] = {1, 1, 1};  // threads per threadgroup, explicit
  bool untyped_buffers = false;   // true: kBuffer slots may have scalar == nullptr (Metal buffers carry no type)
  // true: a Metal encoder's argument table, which keeps earlier dispatches' bindings; slots and threadgroup lengths
  // at indices the kernel has no parameter for are ignored. false (the direct backend): they are an error.
  bool persistent_argument_table = false;
};

// Atomic operations of one launch (csrc/msl_emu/include/msl_emu/atomic_counts.h says what each field counts).
struct AtomicCount {
  uint64_t rmw = 0;         // fetch_add/sub/and/or/xor/min/max and exchange calls
  uint64_t cas = 0;         // compare-exchange attempts
  uint64_t cas_failed = 0;  // attempts that failed: the retries of a CAS loop
  uint64_t load = 0;        // atomic loads
  uint64_t store = 0;       // atomic stores
};

// Input and result of counting a launch's atomics. Every bound [[buffer(n)]] is a range; a buffer whose parameter
// name is a key of `splits` is divided at those byte offsets (ascending, inside the buffer; 0 and its size are
// implied) into parts counted apart (names that are no parameter of the kernel are ignored, so one set of splits
// serves a sequence of launches of different kernels). An operation goes to the buffer of the lowest slot holding its address (bound
// buffers may alias); one in no bound buffer is on threadgroup memory.
struct LaunchAtomics {
  std::map<std::string, std::vector<uint64_t>> splits;  // input: parameter name -> byte offsets
  struct Buffer {
    uint32_t slot = 0;
    std::string param;                   // the kernel's parameter name
    uint64_t bytes = 0;                  // size of the bound buffer
    std::vector<uint64_t> part_begin;    // byte offset where each part starts (part_begin[0] = 0)
    std::vector<AtomicCount> parts;      // one per part
    AtomicCount total;                   // sum of the parts
  };
  std::vector<Buffer> buffers;  // result: the kernel's buffer parameters (constant ones too), by slot
  AtomicCount threadgroup;      // result: operations on threadgroup memory
};

// Is there a kernel of this name in the linked kernel table?
bool HasKernel(const char* name);
// The binding contract without running (data pointers are not looked at). "" when it holds, else the message.
std::string CheckLaunch(const LaunchDesc& d);
// Checks, then runs the kernel over the grid on the CPU. "" on success, else the message (nothing ran). With
// `atomics`, also counts the launch's atomic operations into it (its result fields are overwritten); a split offset
// that is not ascending or lies outside its buffer is an error (nothing ran).
std::string Launch(const LaunchDesc& d, LaunchAtomics* atomics = nullptr);
// The function-constant part of the contract alone (for a pipeline created before any dispatch).
std::string CheckConstants(const char* kernel, const std::vector<ConstantValue>& constants);
// Names of all kernels in the table (for diagnostics and tests).
std::vector<std::string> KernelNames();

}  // namespace tfmo::emu
