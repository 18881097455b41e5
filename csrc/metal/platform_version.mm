// __isPlatformVersionAtLeast: the helper that clang calls for `@available(macOS N, *)` on Apple targets.
// Xcode's driver links it from compiler-rt (libclang_rt.osx.a); no macOS dylib exports it, and a build that does not
// link that archive (a cross build with Linux clang) would leave it unresolved until TF's dlopen(RTLD_NOW) fails.
// This hidden definition resolves it in every build (an object file wins over an archive member). It asks dyld, as
// compiler-rt does on macOS >= 11 (the library's deployment target is 12.0): libSystem's
// _availability_version_check, with versions packed as major << 16 | minor << 8 | subminor.
#if defined(__APPLE__)
#include <cstdint>

extern "C" {
struct tfmo_dyld_build_version {  // dyld_build_version_t
  uint32_t platform;
  uint32_t version;
};
bool _availability_version_check(uint32_t count, tfmo_dyld_build_version versions[]);
}

extern "C" __attribute__((visibility("hidden"))) int32_t __isPlatformVersionAtLeast(uint32_t platform,
                                                                                   uint32_t major, uint32_t minor,
                                                                                   uint32_t subminor) {
  tfmo_dyld_build_version wanted[] = {{platform, ((major & 0xffff) << 16) | ((minor & 0xff) << 8) | (subminor & 0xff)}};
  return _availability_version_check(1, wanted);
}
#endif  // __APPLE__
