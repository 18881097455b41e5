// Negative control for dev/check_mac_host.py: an API newer than the deployment target (macOS 12) used
// without @available must be rejected (-Werror=unguarded-availability-new).
// expect-error: is only available on macOS 13.0 or newer
#import <Metal/Metal.h>

void BrokenAvailability(MTLCompileOptions* options) { options.languageVersion = MTLLanguageVersion3_0; }
