// Loads and runs compiled inline kernels (contract in inline_library.h).
#include "common/inline_library.h"

#include <dlfcn.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "common/thread_pool.h"

namespace tfmo::inline_kernels {
namespace {

std::atomic<TfmoInlineCompiler> g_compiler{nullptr};
std::atomic<int> g_loaded{0};

struct Entry {  // one compiled library
  std::mutex mu;
  bool attempted = false;
  TfmoInlineKernelEntry lookup = nullptr;
  std::string error;
};

std::mutex g_mu;
auto* g_entries = new std::map<std::string, std::shared_ptr<Entry>>();  // never freed: kernels outlive statics

std::shared_ptr<Entry> EntryFor(const std::string& source, bool checked) {
  std::string key = checked ? "c" : "u";
  key += source;
  std::lock_guard<std::mutex> lock(g_mu);
  auto& e = (*g_entries)[key];
  if (!e) e = std::make_shared<Entry>();
  return e;
}

void Load(Entry* e, const std::string& source, bool checked) {
  TfmoInlineCompiler compile = g_compiler.load();
  if (compile == nullptr) {
    e->error = "no inline-kernel compiler is registered in this process: `import tf_metal_ops` registers it (load "
               "the op library through the package, not with tf.load_op_library alone)";
    return;
  }
  char path[4096] = {0};
  std::string message(8192, '\0');
  const int rc = compile(source.c_str(), checked ? TFMO_INLINE_CHECKED : 0, path, sizeof path, message.data(),
                         message.size());
  if (rc != 0) {
    message.resize(std::char_traits<char>::length(message.c_str()));
    e->error = message.empty() ? "compiling the kernel failed" : message;
    if (rc == TFMO_INLINE_REFUSED) e->attempted = false;  // not remembered: consent may come later
    return;
  }
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    e->error = std::string("loading the compiled kernel ") + path + " failed: " + (why ? why : "unknown error");
    return;
  }
  e->lookup = reinterpret_cast<TfmoInlineKernelEntry>(dlsym(handle, "tfmo_inline_kernel"));
  if (e->lookup == nullptr) {
    e->error = std::string("the compiled kernel library ") + path + " exports no tfmo_inline_kernel";
    return;
  }
  g_loaded.fetch_add(1);
}

void PoolFor(int64_t n, int64_t grain, TfmoRangeFn fn, void* arg) {
  ParallelFor(n, grain, [fn, arg](int64_t b, int64_t e) { fn(arg, b, e); });
}

}  // namespace

const TfmoInlineKernel* Get(const std::string& source, const std::string& kernel, bool checked, std::string* error) {
  std::shared_ptr<Entry> e = EntryFor(source, checked);
  TfmoInlineKernelEntry lookup;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    if (!e->attempted) {
      e->attempted = true;
      Load(e.get(), source, checked);
    }
    lookup = e->lookup;
  }
  if (lookup == nullptr) {
    *error = e->error;
    return nullptr;
  }
  const TfmoInlineKernel* k = lookup(kernel.c_str());
  if (k == nullptr || k->abi_version != TFMO_INLINE_ABI_VERSION) {
    *error = "the compiled source defines no kernel '" + kernel + "' (ABI version " +
             std::to_string(TFMO_INLINE_ABI_VERSION) + ")";
    return nullptr;
  }
  return k;
}

bool Run(const TfmoInlineKernel* k, TfmoInlineLaunch* launch, std::string* error) {
  launch->parallel_for = &PoolFor;
  char message[1024] = {0};
  if (k->run(launch, message, sizeof message) == 0) return true;
  *error = message;
  return false;
}

}  // namespace tfmo::inline_kernels

extern "C" void tfmo_set_inline_compiler(TfmoInlineCompiler compiler) {
  tfmo::inline_kernels::g_compiler.store(compiler);
}

extern "C" int tfmo_inline_libraries_loaded(void) { return tfmo::inline_kernels::g_loaded.load(); }
