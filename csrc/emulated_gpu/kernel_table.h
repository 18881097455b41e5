// Internal: the table of kernels that the generated glue units (tf_metal_ops/msl_emu.py) register into
// and kernel_launch.cc reads. Compiled with msl_emu (include dirs csrc/msl_emu/include, csrc/msl_emu).
//
// Conventions and invariants:
//  - includes only standard headers and msl_emu/runtime.h + types.h, never <metal_stdlib>, so that it can be
//    included before <metal_stdlib>'s keyword macros (device, constant, thread, threadgroup, kernel) exist; code
//    that is expanded after a .metal file (the generated tables) must not spell those words;
//  - every generated unit registers its kernels from a static initialiser (link the objects directly, or with
//    --whole-archive, so that none is dropped); registration happens before main/dlopen returns, lookups after;
//  - a thunk receives `slots[0..kMaxBufferSlots)` = host addresses of what is bound at [[buffer(n)]] (null if
//    nothing) and calls the kernel with every argument: buffer slots cast to the parameter's pointer/reference
//    type, [[threadgroup(n)]] arguments from ThreadgroupBlock(n), attributes converted from the ThreadCtx field;
//  - function constants are process-wide globals of their source file: hold FileDesc::mutex from SetConstant
//    until the dispatch has returned.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <tuple>
#include <type_traits>

#include "msl_emu/runtime.h"
#include "msl_emu/types.h"

namespace tfmo::emu::table {

enum class ParamKind : uint8_t { kBuffer, kThreadgroup, kAttribute };
enum class AddressSpace : uint8_t { kNone, kDevice, kConstant, kThreadgroup };  // kNone: attributes (by value)

struct ParamDesc {
  const char* name;       // parameter name as written
  ParamKind kind;
  uint32_t index;         // n of [[buffer(n)]] / [[threadgroup(n)]]; 0 for attributes
  AddressSpace space;
  bool is_const;          // `const` written on the pointee (constant-space parameters are read-only regardless)
  bool is_pointer;        // true: T*, false: T& (buffers, threadgroup) or a value (attributes)
  const char* type;       // pointee type as written ("half", "HgArgs", "atomic_float"); attributes: "uint2", ...
  const char* scalar;     // MSL scalar of the pointee's elements ("float" for float4 and atomic_float), null: struct
  size_t size;            // sizeof(pointee), from the compiler
  size_t align;           // alignof(pointee)
  const char* decl;       // MSL spelling for messages: "device const half*", "constant HgArgs&"
  const char* attribute;  // attributes: "thread_position_in_grid", ...; else null
};

struct ConstantDesc {
  uint32_t index;    // n of [[function_constant(n)]]
  char type;         // 'b' bool, 'i' int, 'u' uint, 'f' float (ConstantValue::type)
  const char* name;  // the global's name
};

using Thunk = void (*)(void* const* slots, const msl_emu::ThreadCtx& t);

struct FileDesc {
  const char* path;  // the original .metal file
  const ConstantDesc* constants;
  size_t num_constants;
  std::mutex* mutex;                           // guards the constants (see header comment)
  void (*set_constant)(uint32_t index, uint32_t bits);  // index/type already checked against `constants`
};

struct KernelDesc {
  const char* name;
  const FileDesc* file;
  const ParamDesc* params;
  size_t num_params;
  Thunk thunk;
  bool needs_fibers;  // reaches a barrier or a SIMD-group function (tf_metal_ops/msl_emu.py); false: the fast path
};

// Defined in kernel_launch.cc. Called from static initialisers of generated units.
void Register(const KernelDesc* k);

// ---- helpers used by generated code -------------------------------------------------------------------------

// Per worker thread, per [[threadgroup(n)]] index: one 32 KiB block, allocated on first use and never
// reallocated (so the pointer a group's threads hold stays valid), freed when the thread exits. One worker runs one
// threadgroup at a time, so the threads of that group (and only they) share it.
constexpr size_t kThreadgroupBlockBytes = 32768;
constexpr uint32_t kThreadgroupBlockSlots = 31;
inline void* ThreadgroupBlock(uint32_t index) {
  struct Blocks {
    void* p[kThreadgroupBlockSlots] = {};
    ~Blocks() {
      for (void* q : p) ::operator delete(q, std::align_val_t(64));
    }
  };
  static thread_local Blocks blocks;
  void*& b = blocks.p[index];
  if (b == nullptr) b = ::operator new(kThreadgroupBlockBytes, std::align_val_t(64));
  return b;
}

// Type of parameter I of a kernel function.
template <class F>
struct FnArgs;
template <class R, class... A>
struct FnArgs<R (*)(A...)> {
  using Tuple = std::tuple<A...>;
};
template <class F, size_t I>
using ParamT = std::tuple_element_t<I, typename FnArgs<F>::Tuple>;
template <class F, size_t I>
using PointeeT = std::remove_cvref_t<std::remove_pointer_t<ParamT<F, I>>>;

// Canonical MSL scalar name of T's elements, or null (structs). Vectors give their element type; msl_emu's atomic
// wrappers (a struct holding std::atomic<value_type> and nothing else) give value_type.
template <class T>
constexpr const char* ScalarName() {
  using U = std::remove_cv_t<T>;
  if constexpr (msl_emu::is_vec_v<U>) {
    return ScalarName<msl_emu::elem_t<U>>();
  } else if constexpr (requires {
                         typename U::value_type;
                         requires std::is_same_v<decltype(U::v), std::atomic<typename U::value_type>>;
                         requires sizeof(U) == sizeof(typename U::value_type);
                       }) {
    return ScalarName<typename U::value_type>();
  } else if constexpr (std::is_same_v<U, float>) {
    return "float";
  } else if constexpr (std::is_same_v<U, half>) {
    return "half";
  } else if constexpr (std::is_same_v<U, bool>) {
    return "bool";
  } else if constexpr (std::is_same_v<U, int>) {
    return "int";
  } else if constexpr (std::is_same_v<U, uint>) {
    return "uint";
  } else if constexpr (std::is_same_v<U, long>) {
    return "long";
  } else if constexpr (std::is_same_v<U, ulong>) {
    return "ulong";
  } else if constexpr (std::is_same_v<U, short>) {
    return "short";
  } else if constexpr (std::is_same_v<U, ushort>) {
    return "ushort";
  } else if constexpr (std::is_same_v<U, char> || std::is_same_v<U, signed char>) {
    return "char";
  } else if constexpr (std::is_same_v<U, uchar>) {
    return "uchar";
  } else {
    return nullptr;
  }
}

// A buffer slot as the parameter type P (pointer: the address; reference: the object at the address).
template <class P>
inline P SlotArg(void* p) {
  if constexpr (std::is_pointer_v<P>) {
    return static_cast<P>(p);
  } else {
    static_assert(std::is_reference_v<P>, "buffer parameter must be a pointer or a reference");
    return *static_cast<std::remove_reference_t<P>*>(p);
  }
}

// A [[threadgroup(n)]] argument: pointer or reference into this worker's block n.
template <class P>
inline P ThreadgroupArg(uint32_t index) {
  if constexpr (std::is_pointer_v<P>) {
    return static_cast<P>(ThreadgroupBlock(index));
  } else {
    return *static_cast<std::remove_reference_t<P>*>(ThreadgroupBlock(index));
  }
}

// An attribute argument: the ThreadCtx field converted to the parameter type (uint/ushort, 2- or 3-vectors of them).
template <class P>
inline P AttrArg(uint v) {
  static_assert(std::is_same_v<P, uint> || std::is_same_v<P, ushort>, "scalar attribute needs uint or ushort");
  return P(v);
}
template <class P>
inline P AttrArg(uint3 v) {
  if constexpr (std::is_same_v<P, uint> || std::is_same_v<P, ushort>) {
    return P(v.x);
  } else {
    static_assert(msl_emu::is_vec_v<P> && (msl_emu::count_v<P> == 2 || msl_emu::count_v<P> == 3) &&
                      (std::is_same_v<msl_emu::elem_t<P>, uint> || std::is_same_v<msl_emu::elem_t<P>, ushort>),
                  "vector attribute needs uint/ushort 2- or 3-vectors");
    if constexpr (msl_emu::count_v<P> == 2) {
      return __builtin_convertvector(v.xy, P);
    } else {
      return __builtin_convertvector(v, P);
    }
  }
}

}  // namespace tfmo::emu::table
