// Negative control for dev/check_mac_host.py: under ARC, TF_TensorData (void*) needs a __bridge cast to
// become an Objective-C object; a plain C cast must be rejected.
// expect-error: requires a bridged cast
#import <Metal/Metal.h>
#include "common/tfc.h"

id<MTLBuffer> BrokenBridge(TF_Tensor* t) { return (id<MTLBuffer>)TF_TensorData(t); }
