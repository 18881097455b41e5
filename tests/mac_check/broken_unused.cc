// Negative control for dev/check_mac_host.py: C++ sources (the CPU kernels, also built on macOS) are compiled
// with -Wall -Wextra -Werror too: an unused variable must be rejected.
// expect-error: unused variable 'never_used'
#include "common/tfc.h"

void BrokenUnused(TF_OpKernelContext* ctx) {
  (void)ctx;
  int never_used = 3;
}
