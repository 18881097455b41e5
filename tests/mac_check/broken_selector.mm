// Negative control for tools/check_mac_host.py: a misspelt Metal selector must be rejected.
// expect-error: dispatchThread:threadsPerThreadgroup:
#include "metal/metal_host.h"

void BrokenSelector(tfmo::metal::Encoder& e) {
  [e.raw() dispatchThread:MTLSizeMake(64, 1, 1) threadsPerThreadgroup:MTLSizeMake(32, 1, 1)];
}
