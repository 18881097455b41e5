// Driver for tests/msl_emu/emu_selftest.metal (tests/test_msl_emu.py). `case=NAME` picks the kernel;
// inputs/outputs/scalars per case are listed at each branch.
#include "harness.h"  // first: standard headers before <metal_stdlib>'s keyword macros

#include "emu_selftest.metal"

// Layout facts the kernels rely on (checked at compile time).
static_assert(sizeof(float3) == 16 && sizeof(uint3) == 16 && sizeof(half4) == 8 && sizeof(ushort2) == 4);
static_assert(alignof(float4) == 16 && sizeof(metal::atomic_uint) == sizeof(uint));

template <class T>
static std::vector<T> filled(size_t n, T v) {
  return std::vector<T>(n, v);
}

int main(int argc, char** argv) {
  msl_emu::Harness h(argc, argv);
  const std::string c = h.scalar<std::string>("case");
  if (c == "block_sum") {  // in:x float32[n]; tg, use_barrier; out:sums float32[ceil(n/tg)]
    const std::vector<float> x = h.input<float>("x");
    const uint n = uint(x.size()), tg = h.scalar<uint>("tg"), use_barrier = h.scalar<uint>("use_barrier");
    const uint groups = (n + tg - 1) / tg;
    std::vector<float> sums(groups, -1.0f);
    msl_emu::dispatch_threadgroups(groups, tg, [&](const msl_emu::ThreadCtx& t) {
      block_sum(x.data(), sums.data(), n, use_barrier, t.thread_position_in_grid.x, t.thread_index_in_threadgroup,
                t.threads_per_threadgroup.x, t.threadgroup_position_in_grid.x);
    });
    h.output("sums", sums);
  } else if (c == "group_count") {  // n, tg; out:counts uint32[ceil(n/tg)] (dispatchThreads, non-uniform)
    const uint n = h.scalar<uint>("n"), tg = h.scalar<uint>("tg");
    std::vector<uint> counts((n + tg - 1) / tg, 0xFFFFFFFFu);
    msl_emu::dispatch_threads(n, tg, [&](const msl_emu::ThreadCtx& t) {
      group_count(counts.data(), t.thread_index_in_threadgroup, t.threadgroup_position_in_grid.x);
    });
    h.output("counts", counts);
  } else if (c == "thread_ids") {  // gx, gy, tx, ty; out:ids uint32[gx*gy*9]
    const uint2 grid = {h.scalar<uint>("gx"), h.scalar<uint>("gy")};
    const uint2 tg = {h.scalar<uint>("tx"), h.scalar<uint>("ty")};
    std::vector<uint> ids(size_t(grid.x) * grid.y * 9, 0xFFFFFFFFu);
    msl_emu::dispatch_threads(grid, tg, [&](const msl_emu::ThreadCtx& t) {
      thread_ids(ids.data(), grid, t.thread_position_in_grid.xy, t.thread_position_in_threadgroup.xy,
                 t.threadgroup_position_in_grid.xy, t.threads_per_threadgroup.xy, t.thread_index_in_threadgroup);
    });
    h.output("ids", ids);
#if __METAL_VERSION__ >= 300
  } else if (c == "atomic_buckets") {  // in:vals float32[n]; k, tg; out: icount usum fsum imax imin isub [k]
    const std::vector<float> vals = h.input<float>("vals");
    const uint n = uint(vals.size()), k = h.scalar<uint>("k"), tg = h.scalar<uint>("tg");
    std::vector<int> icount(k, 0), imax = filled(k, -1), imin = filled(k, 1 << 30), isub(k, 0);
    std::vector<uint> usum(k, 0);
    std::vector<float> fsum(k, 0.0f);
    auto A = [](auto& v) { return reinterpret_cast<metal::atomic<std::remove_reference_t<decltype(v[0])>>*>(v.data()); };
    msl_emu::dispatch_threads(n, tg, [&](const msl_emu::ThreadCtx& t) {
      atomic_buckets(vals.data(), A(icount), A(usum), A(fsum), A(imax), A(imin), A(isub), n, k,
                     t.thread_position_in_grid.x);
    });
    h.output("icount", icount);
    h.output("usum", usum);
    h.output("fsum", fsum);
    h.output("imax", imax);
    h.output("imin", imin);
    h.output("isub", isub);
#endif
  } else if (c == "cas_buckets") {  // in:vals float32[n]; k, tg; out:fsum float32[k]
    const std::vector<float> vals = h.input<float>("vals");
    const uint n = uint(vals.size()), k = h.scalar<uint>("k"), tg = h.scalar<uint>("tg");
    std::vector<float> fsum(k, 0.0f);
    auto* bits = reinterpret_cast<metal::atomic_uint*>(fsum.data());
    msl_emu::dispatch_threads(n, tg, [&](const msl_emu::ThreadCtx& t) {
      cas_buckets(vals.data(), bits, n, k, t.thread_position_in_grid.x);
    });
    h.output("fsum", fsum);
  } else if (c == "cas_buckets_variant") {  // in:vals float32[n]; k, tg, mode, work; out:fsum float32[k], failures uint32[1]
    const std::vector<float> vals = h.input<float>("vals");
    const uint n = uint(vals.size()), k = h.scalar<uint>("k"), tg = h.scalar<uint>("tg");
    const uint mode = h.scalar<uint>("mode"), work = h.scalar<uint>("work");
    std::vector<float> fsum(k, 0.0f);
    std::vector<uint> failures(1, 0u);
    auto* bits = reinterpret_cast<metal::atomic_uint*>(fsum.data());
    auto* fails = reinterpret_cast<metal::atomic_uint*>(failures.data());
    msl_emu::dispatch_threads(n, tg, [&](const msl_emu::ThreadCtx& t) {
      cas_buckets_variant(vals.data(), bits, fails, n, k, mode, work, t.thread_position_in_grid.x);
    });
    h.output("fsum", fsum);
    h.output("failures", failures);
  } else if (c == "vector_ops") {  // in:ab float32[8]; out:out float32[48]
    const std::vector<float> ab = h.input<float>("ab");
    if (ab.size() != 8) msl_emu::Harness::fail("vector_ops needs 8 floats");
    const std::vector<float4> in = {float4{ab[0], ab[1], ab[2], ab[3]}, float4{ab[4], ab[5], ab[6], ab[7]}};
    std::vector<float> out(48, -12345.0f);
    msl_emu::dispatch_threads(1u, 1u, [&](const msl_emu::ThreadCtx& t) {
      vector_ops(in.data(), out.data(), t.thread_position_in_grid.x);
    });
    h.output("out", out);
  } else if (c == "divergent_barrier" || c == "split_barrier") {  // tg; out:out float32[tg]
    const uint tg = h.scalar<uint>("tg");
    std::vector<float> out(tg, 0.0f);
    msl_emu::dispatch_threads(tg, tg, [&](const msl_emu::ThreadCtx& t) {
      if (c == "divergent_barrier") divergent_barrier(out.data(), t.thread_index_in_threadgroup, t.threads_per_threadgroup.x);
      else split_barrier(out.data(), t.thread_index_in_threadgroup);
    });
    h.output("out", out);
  } else if (c == "simd_reduce" || c == "simd_vs_barrier") {  // tg, split, fast; out:out float32[tg]
    const uint tg = h.scalar<uint>("tg"), split = h.scalar<uint>("split", 32u);
    msl_emu::Options opt = msl_emu::Options::from_env();
    opt.fiber_free = h.scalar<uint>("fast", 0u) != 0;  // a wrong detection: SIMD calls on the fast path
    opt.kernel_name = c.c_str();
    std::vector<float> out(tg, -1.0f);
    msl_emu::dispatch_threads(tg, tg, [&](const msl_emu::ThreadCtx& t) {
      if (c == "simd_reduce") simd_reduce(out.data(), split, t.thread_index_in_threadgroup, t.thread_index_in_simdgroup);
      else simd_vs_barrier(out.data(), t.thread_index_in_threadgroup);
    }, opt);
    h.output("out", out);
  } else if (c == "oob_write") {  // in:x float32[n]; out:y float32[n]
    const std::vector<float> x = h.input<float>("x");
    const uint n = uint(x.size());
    std::vector<float> y(n, 0.0f);
    msl_emu::dispatch_threads(n, 32u, [&](const msl_emu::ThreadCtx& t) {
      oob_write(x.data(), y.data(), n, t.thread_position_in_grid.x);
    });
    h.output("y", y);
  } else {
    msl_emu::Harness::fail("unknown case '%s' (at __METAL_VERSION__ %d)", c.c_str(), __METAL_VERSION__);
  }
  return h.finish();
}
