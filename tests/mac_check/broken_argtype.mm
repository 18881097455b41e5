// Negative control for dev/check_mac_host.py: wrong arguments to the TF C API (TF_GetStream takes a status)
// and to Metal (an index given as a string) must be rejected.
// expect-error: requires 2 arguments, but 1 was provided
// expect-error: cannot initialize a parameter of type 'NSUInteger'
#import <Metal/Metal.h>
#include "common/tfc.h"

void BrokenArguments(TF_OpKernelContext* ctx, id<MTLComputeCommandEncoder> enc, uint32_t n) {
  (void)TF_GetStream(ctx);
  [enc setBytes:&n length:sizeof n atIndex:"2"];
}
