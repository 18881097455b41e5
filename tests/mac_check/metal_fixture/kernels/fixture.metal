// Fixture for tf_metal_ops/metal_sources.py: quoted includes inlined once each, <...> kept. Not a real kernel.
#include <metal_stdlib>
#include "common.h"
#include "nested.h"
#include "common.h"
#define TFMO_FIXTURE_STR "quote \" backslash \\ trigraph ??= tab	end"
kernel void fixture_kernel(device float* out [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
  out[gid] = fixture_twice(float(gid));  // non-ASCII in a comment: λ µ
}
