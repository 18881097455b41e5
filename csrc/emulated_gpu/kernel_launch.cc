// Implements kernel_launch.h over the kernel table that the generated glue units register into (kernel_table.h).
// Free of <metal_stdlib> (only msl_emu/runtime.h + types.h through kernel_table.h), so standard headers are safe.
//
// Conventions:
//  - every message starts with the kernel name and names the slot, the parameter and both types;
//  - Launch re-checks the contract (and data addresses/alignment) before touching anything: on error nothing ran;
//  - workers: env TF_METAL_OPS_EMULATED_GPU_WORKERS, else MSL_EMU_WORKERS, else all CPUs (0 also means all CPUs);
//    MSL_EMU_ORDER / MSL_EMU_SEED apply as in msl_emu; files that call neither threadgroup_barrier nor a
//    SIMD-group function run on the fiber-free fast path.
#include "kernel_launch.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernel_table.h"

namespace tfmo::emu {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, const table::KernelDesc*> kernels;
  std::map<std::string, std::string> duplicates;  // name -> message (a name registered by two files)
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: generated units may register during static init
  return *r;
}

std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

const char* TypeName(char t) {
  switch (t) {
    case 'b': return "bool";
    case 'i': return "int";
    case 'u': return "uint";
    case 'f': return "float";
    default: return nullptr;
  }
}

const table::KernelDesc* Find(const char* name, std::string* err) {
  if (name == nullptr || *name == '\0') {
    *err = "no kernel name given";
    return nullptr;
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (auto d = r.duplicates.find(name); d != r.duplicates.end()) {
    *err = d->second;
    return nullptr;
  }
  auto it = r.kernels.find(name);
  if (it == r.kernels.end()) {
    *err = Format("unknown kernel '%s': no generated glue registered it (%zu kernels are known)", name,
                  r.kernels.size());
    return nullptr;
  }
  return it->second;
}

// Function constants: exactly the file's, each with its declared type.
std::string CheckConstants(const table::KernelDesc& kd, const std::vector<ConstantValue>& constants) {
  const char* k = kd.name;
  const table::FileDesc& f = *kd.file;
  for (size_t i = 0; i < constants.size(); ++i) {
    const ConstantValue& c = constants[i];
    if (i > 0 && constants[i - 1].index >= c.index)
      return Format("%s: function constants must be sorted by index and unique (index %u follows %u)", k, c.index,
                    constants[i - 1].index);
    if (TypeName(c.type) == nullptr)
      return Format("%s: function constant %u has type code '%c' (expected b, i, u or f)", k, c.index, c.type);
    const table::ConstantDesc* decl = nullptr;
    for (size_t j = 0; j < f.num_constants; ++j)
      if (f.constants[j].index == c.index) decl = &f.constants[j];
    if (decl == nullptr)
      return Format("%s: function constant %u is given, but %s declares no [[function_constant(%u)]]", k, c.index,
                    f.path, c.index);
    if (decl->type != c.type)
      return Format("%s: function constant %u '%s' is %s, but the value given is %s", k, c.index, decl->name,
                    TypeName(decl->type), TypeName(c.type));
  }
  for (size_t j = 0; j < f.num_constants; ++j) {
    const table::ConstantDesc& c = f.constants[j];
    bool given = false;
    for (const ConstantValue& v : constants) given |= v.index == c.index;
    if (!given)
      return Format("%s: function constant %u '%s' (%s) of %s has no value", k, c.index, c.name, TypeName(c.type),
                    f.path);
  }
  return "";
}

std::string CheckBuffer(const char* k, const table::ParamDesc& p, const SlotBinding& b, bool untyped) {
  const uint32_t n = p.index;
  if (b.kind == SlotBinding::Kind::kNone)
    return Format("%s: buffer(%u) '%s' is %s, but nothing is bound there", k, n, p.name, p.decl);
  const bool bytes = b.kind == SlotBinding::Kind::kBytes;
  if (bytes && p.space == table::AddressSpace::kDevice && !p.is_const)
    return Format("%s: buffer(%u) '%s' is %s, which the kernel may write, but read-only bytes (setBytes) are bound",
                  k, n, p.name, p.decl);
  if (b.kind == SlotBinding::Kind::kBuffer && p.scalar != nullptr) {
    if (b.scalar == nullptr && !untyped)
      return Format("%s: buffer(%u) '%s' is %s, but a buffer of unknown element type is bound", k, n, p.name, p.decl);
    if (b.scalar != nullptr && std::strcmp(b.scalar, p.scalar) != 0)
      return Format("%s: buffer(%u) '%s' is %s, but a %s buffer is bound", k, n, p.name, p.decl, b.scalar);
  }
  if (p.is_pointer) {
    if (b.bytes % p.size != 0)
      return Format("%s: buffer(%u) '%s' is %s, but the bound %s has %zu bytes, not a multiple of sizeof(%s) = %zu",
                    k, n, p.name, p.decl, bytes ? "bytes" : "buffer", b.bytes, p.type, p.size);
  } else if (bytes) {
    if (b.bytes != p.size)
      return Format("%s: buffer(%u) '%s' is %s, but %zu bytes are bound (sizeof(%s) = %zu)", k, n, p.name, p.decl,
                    b.bytes, p.type, p.size);
  } else if (b.bytes < p.size) {
    return Format("%s: buffer(%u) '%s' is %s, but the bound buffer has %zu bytes, less than sizeof(%s) = %zu", k, n,
                  p.name, p.decl, b.bytes, p.type, p.size);
  }
  return "";
}

std::string CheckGrid(const char* k, const LaunchDesc& d) {
  const char* what = d.threadgroups ? "threadgroup count" : "grid (threads)";
  for (int i = 0; i < 3; ++i)
    if (d.grid[i] == 0 || d.grid[i] > 0xFFFFFFFFull)
      return Format("%s: %s dimension %d is %" PRIu64 ", must be in 1 .. 4294967295", k, what, i, d.grid[i]);
  for (int i = 0; i < 3; ++i)
    if (d.group[i] == 0) return Format("%s: threads per threadgroup dimension %d is 0", k, i);
  const uint64_t threads = uint64_t(d.group[0]) * d.group[1] * d.group[2];
  if (threads > kMaxThreadsPerGroup)
    return Format("%s: threadgroup of %ux%ux%u = %" PRIu64 " threads exceeds %u threads per threadgroup", k,
                  d.group[0], d.group[1], d.group[2], threads, kMaxThreadsPerGroup);
  if (d.threadgroups)
    for (int i = 0; i < 3; ++i)
      if (d.grid[i] * d.group[i] > 0xFFFFFFFFull)
        return Format("%s: threadgroup count %" PRIu64 " x %u threads in dimension %d exceeds 4294967295 threads "
                      "(thread positions are uint)",
                      k, d.grid[i], d.group[i], i);
  return "";
}

std::string Check(const table::KernelDesc& kd, const LaunchDesc& d) {
  const char* k = kd.name;
  bool buffer_param[kMaxBufferSlots] = {}, tg_param[kMaxThreadgroupSlots] = {};
  size_t tg_total = 0;
  for (size_t i = 0; i < kd.num_params; ++i) {
    const table::ParamDesc& p = kd.params[i];
    if (p.kind == table::ParamKind::kBuffer) {
      buffer_param[p.index] = true;
      if (std::string e = CheckBuffer(k, p, d.buffers[p.index], d.untyped_buffers); !e.empty()) return e;
    } else if (p.kind == table::ParamKind::kThreadgroup) {
      tg_param[p.index] = true;
      const size_t len = d.threadgroup_memory[p.index];
      if (len == 0)
        return Format("%s: threadgroup(%u) '%s' is %s, but no threadgroup memory length is set for index %u", k,
                      p.index, p.name, p.decl, p.index);
      if (len % p.size != 0)
        return Format("%s: threadgroup(%u) '%s' is %s, but its threadgroup memory length %zu is not a multiple of "
                      "sizeof(%s) = %zu",
                      k, p.index, p.name, p.decl, len, p.type, p.size);
    }
  }
  for (uint32_t n = 0; n < kMaxBufferSlots && !d.persistent_argument_table; ++n)
    if (!buffer_param[n] && d.buffers[n].kind != SlotBinding::Kind::kNone)
      return Format("%s: buffer(%u) is bound, but the kernel has no [[buffer(%u)]] parameter", k, n, n);
  for (uint32_t n = 0; n < kMaxThreadgroupSlots; ++n) {
    if (d.threadgroup_memory[n] == 0 || (!tg_param[n] && d.persistent_argument_table)) continue;
    if (!tg_param[n])
      return Format("%s: threadgroup memory length %zu is set for index %u, but the kernel has no [[threadgroup(%u)]] "
                    "parameter",
                    k, d.threadgroup_memory[n], n, n);
    tg_total += d.threadgroup_memory[n];
  }
  if (tg_total > kMaxThreadgroupMemory)
    return Format("%s: threadgroup memory of %zu bytes in all exceeds the %zu-byte limit", k, tg_total,
                  kMaxThreadgroupMemory);

  if (std::string e = CheckConstants(kd, d.constants); !e.empty()) return e;
  return CheckGrid(k, d);
}

unsigned WorkersFromEnv() {
  const char* s = std::getenv("TF_METAL_OPS_EMULATED_GPU_WORKERS");
  if (s == nullptr || *s == '\0') s = std::getenv("TF_METAL_OPS_EMU_WORKERS");  // the deprecated name
  if (s == nullptr || *s == '\0') s = std::getenv("MSL_EMU_WORKERS");
  unsigned n = 0;
  if (s != nullptr && *s != '\0') n = unsigned(std::strtoul(s, nullptr, 10));
  if (n == 0) n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

}  // namespace

namespace table {
void Register(const KernelDesc* k) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto [it, inserted] = r.kernels.emplace(k->name, k);
  if (!inserted && it->second != k)
    r.duplicates[k->name] = Format("kernel '%s' is defined in two kernel files: %s and %s", k->name,
                                   it->second->file->path, k->file->path);
}
}  // namespace table

bool HasKernel(const char* name) {
  std::string err;
  return Find(name, &err) != nullptr;
}

std::vector<std::string> KernelNames() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, desc] : r.kernels) names.push_back(name);
  return names;
}

std::string CheckLaunch(const LaunchDesc& d) {
  std::string err;
  const table::KernelDesc* kd = Find(d.kernel, &err);
  if (kd == nullptr) return err;
  return Check(*kd, d);
}

std::string CheckConstants(const char* kernel, const std::vector<ConstantValue>& constants) {
  std::string err;
  const table::KernelDesc* kd = Find(kernel, &err);
  if (kd == nullptr) return err;
  return CheckConstants(*kd, constants);
}

namespace {

// The ranges of a counting launch (LaunchAtomics' rules) and the result records, filled from the counts later.
std::string PrepareAtomics(const table::KernelDesc& kd, const LaunchDesc& d, LaunchAtomics* a,
                           std::vector<msl_emu::AtomicRange>* ranges) {
  a->buffers.clear();
  a->threadgroup = AtomicCount();
  for (uint32_t slot = 0; slot < kMaxBufferSlots; ++slot) {
    for (size_t i = 0; i < kd.num_params; ++i) {
      const table::ParamDesc& p = kd.params[i];
      if (p.kind != table::ParamKind::kBuffer || p.index != slot) continue;
      const SlotBinding& b = d.buffers[slot];
      LaunchAtomics::Buffer rec;
      rec.slot = slot;
      rec.param = p.name;
      rec.bytes = b.bytes;
      rec.part_begin.push_back(0);
      if (auto it = a->splits.find(p.name); it != a->splits.end()) {
        int64_t prev = -1;
        for (uint64_t off : it->second) {
          if (static_cast<int64_t>(off) <= prev)
            return Format("%s: atomic counting: split offsets of '%s' must ascend (%llu after %lld)", kd.name, p.name,
                          static_cast<unsigned long long>(off), static_cast<long long>(prev));
          if (off >= b.bytes)
            return Format("%s: atomic counting: split offset %llu of '%s' is not inside its %zu-byte buffer", kd.name,
                          static_cast<unsigned long long>(off), p.name, b.bytes);
          prev = static_cast<int64_t>(off);
          if (off > 0) rec.part_begin.push_back(off);
        }
      }
      const uintptr_t base = reinterpret_cast<uintptr_t>(b.data);
      for (size_t k = 0; k < rec.part_begin.size(); ++k) {
        const uint64_t end = k + 1 < rec.part_begin.size() ? rec.part_begin[k + 1] : b.bytes;
        ranges->push_back({base + rec.part_begin[k], base + end});
      }
      rec.parts.resize(rec.part_begin.size());
      a->buffers.push_back(std::move(rec));
    }
  }
  return "";
}

AtomicCount ToCount(const msl_emu::AtomicTally& t) {
  AtomicCount c;
  c.rmw = t.rmw, c.cas = t.cas, c.cas_failed = t.cas_failed, c.load = t.load, c.store = t.store;
  return c;
}

void AddCount(AtomicCount& a, const AtomicCount& b) {
  a.rmw += b.rmw, a.cas += b.cas, a.cas_failed += b.cas_failed, a.load += b.load, a.store += b.store;
}

}  // namespace

std::string Launch(const LaunchDesc& d, LaunchAtomics* atomics) {
  std::string err;
  const table::KernelDesc* kd = Find(d.kernel, &err);
  if (kd == nullptr) return err;
  if (std::string e = Check(*kd, d); !e.empty()) return e;

  void* slots[kMaxBufferSlots] = {};
  for (size_t i = 0; i < kd->num_params; ++i) {
    const table::ParamDesc& p = kd->params[i];
    if (p.kind != table::ParamKind::kBuffer) continue;
    const SlotBinding& b = d.buffers[p.index];
    if (b.data == nullptr && b.bytes > 0)
      return Format("%s: buffer(%u) '%s' (%s) is bound with %zu bytes but no data address", kd->name, p.index, p.name,
                    p.decl, b.bytes);
    if (reinterpret_cast<uintptr_t>(b.data) % p.align != 0)
      return Format("%s: buffer(%u) '%s' (%s): data address %p is not aligned to alignof(%s) = %zu", kd->name,
                    p.index, p.name, p.decl, b.data, p.type, p.align);
    slots[p.index] = b.data;
  }

  msl_emu::Options opt = msl_emu::Options::from_env();
  opt.workers = WorkersFromEnv();
  opt.fiber_free = !kd->needs_fibers;
  opt.kernel_name = kd->name;
  const uint3 grid = {uint(d.grid[0]), uint(d.grid[1]), uint(d.grid[2])};
  const uint3 group = {d.group[0], d.group[1], d.group[2]};
  const table::Thunk thunk = kd->thunk;
  auto call = [&slots, thunk](const msl_emu::ThreadCtx& t) { thunk(slots, t); };

  std::vector<msl_emu::AtomicRange> ranges;
  if (atomics != nullptr)
    if (std::string e = PrepareAtomics(*kd, d, atomics, &ranges); !e.empty()) return e;
  msl_emu::AtomicCounts counts(std::move(ranges));
  if (atomics != nullptr) opt.atomic_counts = &counts;

  const table::FileDesc& f = *kd->file;
  std::unique_lock<std::mutex> lock;  // held from setting the constants until the dispatch returns
  if (f.num_constants > 0) {
    lock = std::unique_lock<std::mutex>(*f.mutex);
    for (const ConstantValue& c : d.constants) f.set_constant(c.index, c.bits);
  }
  if (d.threadgroups) {
    msl_emu::dispatch_threadgroups(grid, group, call, opt);
  } else {
    msl_emu::dispatch_threads(grid, group, call, opt);
  }
  if (atomics != nullptr) {
    size_t r = 0;
    for (LaunchAtomics::Buffer& b : atomics->buffers)
      for (AtomicCount& part : b.parts) {
        part = ToCount(counts.in_range()[r++]);
        AddCount(b.total, part);
      }
    atomics->threadgroup = ToCount(counts.outside());
  }
  return "";
}

}  // namespace tfmo::emu
