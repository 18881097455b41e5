// Negative control for dev/check_mac_host.py: a misspelt Metal selector must be rejected.
// expect-error: dispatchThread:threadsPerThreadgroup:
#import <Metal/Metal.h>

void BrokenSelector(id<MTLComputeCommandEncoder> enc) {
  [enc dispatchThread:MTLSizeMake(64, 1, 1) threadsPerThreadgroup:MTLSizeMake(32, 1, 1)];
}
