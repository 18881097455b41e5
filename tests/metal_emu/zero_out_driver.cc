// Runs metal_kernels/zero_out.metal through the MSL emulation (tools/msl_emu).
// Args: in:x:DTYPE:N=PATH out:y=PATH dtype=DTYPE [tg=THREADS_PER_THREADGROUP] [poison=1]
// Mirrors the host: dispatchThreads(n, tg) with the kernel of the dtype, no dispatch when n == 0.
// The output buffer is pre-filled with a non-zero poison pattern so that an element the kernel fails to
// write cannot pass as zero.
#include "harness.h"  // first: standard headers before <metal_stdlib>'s keyword macros

#include "zero_out.metal"

template <class T, class K>
static void run(msl_emu::Harness& h, K kernel_fn, uint tg) {
  const std::vector<T> in = h.input<T>("x");
  std::vector<T> out(in.size());
  if (!out.empty()) std::memset(out.data(), 0x5A, out.size() * sizeof(T));  // poison (memset(nullptr) is UB)
  const uint n = uint(in.size());
  if (n > 0) {
    msl_emu::dispatch_threads(n, tg, [&](const msl_emu::ThreadCtx& t) {
      kernel_fn(in.data(), out.data(), n, t.thread_position_in_grid.x);
    });
  }
  h.output("y", out);
}

int main(int argc, char** argv) {
  msl_emu::Harness h(argc, argv);
  const std::string dtype = h.scalar<std::string>("dtype");
  const uint tg = h.scalar<uint>("tg", 64);
  if (dtype == "int32") run<int>(h, zero_out_int32, tg);
  else if (dtype == "int64") run<long>(h, zero_out_int64, tg);
  else if (dtype == "float32") run<float>(h, zero_out_float32, tg);
  else if (dtype == "float16") run<half>(h, zero_out_float16, tg);
  else msl_emu::Harness::fail("unsupported dtype %s", dtype.c_str());
  return h.finish();
}
