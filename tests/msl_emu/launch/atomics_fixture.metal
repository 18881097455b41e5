// Fixture of tests/test_msl_emu_atomics.py: kernels with a known number of atomic operations, run by name through
// csrc/emulated_gpu/kernel_launch.cc with atomic counting. The file calls neither threadgroup_barrier nor a SIMD-group
// function, so its kernels run on msl_emu's fiber-free fast path.
#include <metal_stdlib>
using namespace metal;

struct AddArgs {
  uint n;     // threads that do work
  uint k;     // atomic adds per thread
  uint m;     // elements of acc
  uint skip;  // thread that does one add fewer (>= n: none)
};

// Thread i < n adds 1 to acc[(i * k + j) % m] for j < k (j < k - 1 for thread `skip`): n * k RMWs (one fewer with skip).
kernel void atomic_adds(device atomic_uint* acc [[buffer(0)]], constant AddArgs& a [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
  if (i >= a.n) return;
  const uint k = i == a.skip ? a.k - 1 : a.k;
  for (uint j = 0; j < k; ++j) atomic_fetch_add_explicit(&acc[(i * a.k + j) % a.m], 1u, memory_order_relaxed);
}

// Every thread i < n adds 1 to word[0] with a load and a compare-and-swap loop (contended): word[0] ends at n;
// n loads, and CAS attempts = n successes + the failed attempts.
kernel void cas_increment(device atomic_uint* word [[buffer(0)]], constant uint& n [[buffer(1)]],
                          uint i [[thread_position_in_grid]]) {
  if (i >= n) return;
  uint expected = atomic_load_explicit(&word[0], memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(&word[0], &expected, expected + 1u, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

// Per thread i < n: 7 RMWs, 1 store and 1 load on device memory (words 0..7), and on threadgroup memory 1 store and
// 2 RMWs (its own word of tg) and a compare-exchange that always fails once (expected != the stored value) and then
// succeeds.
kernel void mixed_ops(device atomic_int* d [[buffer(0)]], constant uint& n [[buffer(1)]],
                      threadgroup atomic_uint* tg [[threadgroup(0)]], uint i [[thread_position_in_grid]],
                      uint t [[thread_index_in_threadgroup]]) {
  if (i >= n) return;
  atomic_fetch_sub_explicit(&d[0], 1, memory_order_relaxed);
  atomic_fetch_min_explicit(&d[1], int(i), memory_order_relaxed);
  atomic_fetch_max_explicit(&d[2], int(i), memory_order_relaxed);
  atomic_fetch_and_explicit(&d[3], int(i), memory_order_relaxed);
  atomic_fetch_or_explicit(&d[4], int(i), memory_order_relaxed);
  atomic_fetch_xor_explicit(&d[5], int(i), memory_order_relaxed);
  atomic_exchange_explicit(&d[6], int(i), memory_order_relaxed);
  atomic_store_explicit(&d[7], int(i), memory_order_relaxed);
  (void)atomic_load_explicit(&d[7], memory_order_relaxed);
  atomic_store_explicit(&tg[t], 5u, memory_order_relaxed);
  atomic_fetch_add_explicit(&tg[t], 1u, memory_order_relaxed);
  atomic_fetch_or_explicit(&tg[t], 8u, memory_order_relaxed);
  uint expected = 0u;  // tg[t] is 14: the first attempt fails and loads 14 into `expected`
  while (!atomic_compare_exchange_weak_explicit(&tg[t], &expected, expected + 1u, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

// y[i] = 2 x[i]: no atomics.
kernel void plain_double(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                         uint i [[thread_position_in_grid]]) {
  y[i] = 2.0f * x[i];
}
