// Driver for tests/test_msl_emu_fibers.py: kernels that switch fibers many times (csrc/msl_emu/include/msl_emu/fiber_switch.h).
// `case=NAME` picks the kernel; inputs/outputs/scalars per case are listed at each branch. The kernels are C++
// (recursion, <cfenv>), not MSL: they test the emulation's context switch, not a Metal kernel.
#include <cfenv>

#include "harness.h"  // first: standard headers before <metal_stdlib>'s keyword macros

using namespace metal;

// Each of `iters` rounds: two barriers around a neighbour read through threadgroup memory, then a simd_sum and a
// simd_shuffle_down, i.e. four fiber switches per thread per round. Seven values stay live across every switch
// (integers and floats, so the compiler keeps some in callee-saved registers). Group sizes are multiples of 32.
static void switch_loop(device uint* out_u, device float* out_f, uint iters, uint gid, uint lid, uint tg_size) {
  threadgroup uint tile[1024];
  uint a = gid * 2654435761u + 1u, b = gid ^ 0x5bd1e995u, c = lid + 7u;
  float fa = float(gid % 1000u), fb = 0.25f * float(lid);
  double da = double(gid) * 0.5, db = 1.0;
  for (uint k = 0; k < iters; ++k) {
    tile[lid] = a;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const uint nb = tile[(lid + 1u) % tg_size];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const uint s = simd_sum(a & 0xFFu);
    const uint sh = simd_shuffle_down(b, 1u);  // the last lane of a full SIMD group reads its own value
    a = a * 1664525u + 1013904223u + nb;
    b = (b ^ s) + sh;
    c = c * 3u + (s & 7u);
    fa = fa * 0.5f;
    fa += float(s & 0xFFFu);
    fb += 1.0f;
    da = da * 0.75;
    da += double(nb & 0xFFu);
    db += double(c & 1u);
  }
  out_u[gid * 3] = a;
  out_u[gid * 3 + 1] = b;
  out_u[gid * 3 + 2] = c;
  out_f[gid * 4] = fa;
  out_f[gid * 4 + 1] = fb;
  out_f[gid * 4 + 2] = float(da);
  out_f[gid * 4 + 3] = float(db);
}

// Thread lid sets rounding mode kModes[lid % 4], and after a barrier (other threads set other modes meanwhile)
// reads it back (out_mode: its index in kModes) and divides +-1 by 3 in float (SSE/NEON: MXCSR/FPCR) and in
// long double (x87 on x86-64: the x87 control word). It restores round-to-nearest before returning.
static constexpr int kModes[4] = {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};

static int mode_index() {  // position of the current rounding mode in kModes, -1 if none
  const int m = std::fegetround();
  for (int i = 0; i < 4; ++i)
    if (kModes[i] == m) return i;
  return -1;
}

static void fp_control(device int* out_mode, device uint* out_q, device float* one, device float* three, uint gid,
                       uint lid) {
#pragma STDC FENV_ACCESS ON
  std::fesetround(kModes[lid % 4]);
  threadgroup_barrier(mem_flags::mem_none);
  out_mode[gid] = mode_index();
  const volatile float x = one[gid], y = three[gid];
  const float qp = x / y, qn = -x / y;
  const long double lp = (long double)x / (long double)y, ln = -(long double)x / (long double)y;
  out_q[gid * 4] = as_type<uint>(qp);
  out_q[gid * 4 + 1] = as_type<uint>(qn);
  out_q[gid * 4 + 2] = as_type<uint>(float(lp));
  out_q[gid * 4 + 3] = as_type<uint>(float(ln));
  threadgroup_barrier(mem_flags::mem_none);
  std::fesetround(FE_TONEAREST);
}

// Recursion of `depth` frames of at least `frame` bytes each, around a barrier: more than MSL_EMU_STACK_KB of them
// runs into the fiber stack's guard page.
[[gnu::noinline]] static uint deep(uint depth, uint seed) {
  volatile unsigned char buf[512];
  for (uint i = 0; i < sizeof buf; i += 64) buf[i] = (unsigned char)(seed + i);
  if (depth == 0) return buf[0];
  return deep(depth - 1, seed + 1) + buf[64];
}

static void deep_stack(device uint* out, uint depth, uint gid) {
  const uint before = deep(depth, gid);
  threadgroup_barrier(mem_flags::mem_none);
  out[gid] = before + deep(depth, gid + 1);
}

int main(int argc, char** argv) {
  msl_emu::Harness h(argc, argv);
  const std::string c = h.scalar<std::string>("case");
  if (c == "switch_loop") {  // n, tg, iters; out:u uint32[3n] out:f float32[4n]
    const uint n = h.scalar<uint>("n"), tg = h.scalar<uint>("tg"), iters = h.scalar<uint>("iters");
    std::vector<uint> u(size_t(n) * 3, 0xFFFFFFFFu);
    std::vector<float> f(size_t(n) * 4, -1.0f);
    msl_emu::dispatch_threads(n, tg, [&](const msl_emu::ThreadCtx& t) {
      switch_loop(u.data(), f.data(), iters, t.thread_position_in_grid.x, t.thread_index_in_threadgroup,
                  t.threads_per_threadgroup.x);
    });
    h.output("u", u);
    h.output("f", f);
  } else if (c == "fp_control") {  // in:one float32[n] in:three float32[n]; tg; out:mode int32[n+1] out:q uint32[4n]
    const std::vector<float> one = h.input<float>("one"), three = h.input<float>("three");
    const uint n = uint(one.size()), tg = h.scalar<uint>("tg");
    std::vector<int> mode(n + 1, -1);
    std::vector<uint> q(size_t(n) * 4, 0);
    std::vector<float> one_w(one), three_w(three);
    msl_emu::dispatch_threads(n, tg, [&](const msl_emu::ThreadCtx& t) {
      fp_control(mode.data(), q.data(), one_w.data(), three_w.data(), t.thread_position_in_grid.x,
                 t.thread_index_in_threadgroup);
    });
    mode[n] = mode_index();  // the launching thread's mode after the dispatch
    h.output("mode", mode);
    h.output("q", q);
  } else if (c == "deep_stack") {  // n, tg, depth; out:out uint32[n]
    const uint n = h.scalar<uint>("n"), tg = h.scalar<uint>("tg"), depth = h.scalar<uint>("depth");
    std::vector<uint> out(n, 0xFFFFFFFFu);
    msl_emu::dispatch_threads(n, tg, [&](const msl_emu::ThreadCtx& t) {
      deep_stack(out.data(), depth, t.thread_position_in_grid.x);
    });
    h.output("out", out);
  } else {
    h.fail("unknown case '%s'", c.c_str());
  }
  return h.finish();
}
