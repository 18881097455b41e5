// msl_emu harness: the I/O side of a kernel test driver (see csrc/msl_emu/README.md, "Driver pattern"). A test tool:
// it lives beside the drivers, outside what ships.
//
// Command line of a driver (tests/support/msl_emu_build.py writes it; tokens in any order):
//   in:NAME:DTYPE:COUNT=PATH   raw little-endian array (numpy `tofile`), COUNT elements of DTYPE
//   out:NAME=PATH              where the driver writes output NAME (raw, the dtype the driver chooses)
//   NAME=VALUE                 a scalar or string
// DTYPE is a numpy dtype name: float32 float16 float64 int8..int64 uint8..uint64 bool.
// Every argument must be consumed and every out: written, or finish() fails (catches typos on both sides).
// Harness errors exit with status 2 and "msl_emu harness: error: ..." on stderr.
//
// Include this header first, before the .metal file: <metal_stdlib> defines keyword macros (device,
// thread, ...) that would break standard headers included after it.
#pragma once

#ifdef MSL_EMU_METAL_STDLIB_INCLUDED
#error "include harness.h before <metal_stdlib> and the .metal file"
#endif

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <metal_stdlib>

namespace msl_emu {

template <class T>
constexpr const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, half>) return "float16";
  else if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 1) return "int8";
  else if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 2) return "int16";
  else if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 4) return "int32";
  else if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 8) return "int64";
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 1) return "uint8";
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 2) return "uint16";
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 4) return "uint32";
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 8) return "uint64";
  else static_assert(sizeof(T) == 0, "no dtype name for this type");
}

class Harness {
 public:
  Harness(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const size_t eq = a.find('=');
      if (eq == std::string::npos || eq == 0) fail("argument '%s' is not KEY=VALUE", a.c_str());
      const std::string key = a.substr(0, eq), val = a.substr(eq + 1);
      if (key.rfind("in:", 0) == 0) {
        const size_t c1 = key.find(':', 3), c2 = c1 == std::string::npos ? c1 : key.find(':', c1 + 1);
        if (c2 == std::string::npos) fail("input '%s' is not in:NAME:DTYPE:COUNT=PATH", key.c_str());
        Input in;
        in.dtype = key.substr(c1 + 1, c2 - c1 - 1);
        in.count = parse_u64(key.substr(c2 + 1), key.c_str());
        in.path = val;
        add(inputs_, key.substr(3, c1 - 3), in);
      } else if (key.rfind("out:", 0) == 0) {
        add(outputs_, key.substr(4), Output{val, false});
      } else {
        add(scalars_, key, Scalar{val, false});
      }
    }
  }

  // Reads input NAME; T must match its DTYPE and the file must hold exactly COUNT elements.
  template <class T>
  std::vector<T> input(const char* name) {
    Input& in = find(inputs_, name, "input");
    if (in.dtype != dtype_name<T>())
      fail("input '%s' has dtype %s but the driver reads %s", name, in.dtype.c_str(), dtype_name<T>());
    in.used = true;
    std::vector<T> v(in.count);
    FILE* f = std::fopen(in.path.c_str(), "rb");
    if (!f) fail("cannot open input '%s' (%s): %s", name, in.path.c_str(), std::strerror(errno));
    const size_t got = v.empty() ? 0 : std::fread(v.data(), sizeof(T), v.size(), f);
    const bool extra = std::fgetc(f) != EOF;
    std::fclose(f);
    if (got != v.size() || extra)
      fail("input '%s' (%s) does not hold exactly %zu %s elements", name, in.path.c_str(), v.size(), dtype_name<T>());
    return v;
  }

  // Writes output NAME (raw bytes of v).
  template <class T>
  void output(const char* name, const std::vector<T>& v) {
    Output& o = find(outputs_, name, "output");
    FILE* f = std::fopen(o.path.c_str(), "wb");
    if (!f) fail("cannot create output '%s' (%s): %s", name, o.path.c_str(), std::strerror(errno));
    const size_t put = v.empty() ? 0 : std::fwrite(v.data(), sizeof(T), v.size(), f);
    if (std::fclose(f) != 0 || put != v.size()) fail("writing output '%s' (%s) failed", name, o.path.c_str());
    o.written = true;
  }

  // Scalar NAME as T (integers: decimal/0x; floats; std::string verbatim). Without a default it is required.
  template <class T>
  T scalar(const char* name) {
    Scalar& s = find(scalars_, name, "scalar");
    s.used = true;
    return convert<T>(s.value, name);
  }
  template <class T>
  T scalar(const char* name, T dflt) {
    auto it = scalars_.find(name);
    if (it == scalars_.end()) return dflt;
    it->second.used = true;
    return convert<T>(it->second.value, name);
  }
  bool has(const char* name) const { return scalars_.count(name) || inputs_.count(name); }

  // Call last (`return h.finish();`): fails if an argument was never read or an output never written.
  int finish() {
    for (auto& [k, v] : inputs_)
      if (!v.used) fail("input '%s' was given but the driver never read it", k.c_str());
    for (auto& [k, v] : scalars_)
      if (!v.used) fail("scalar '%s' was given but the driver never read it", k.c_str());
    for (auto& [k, v] : outputs_)
      if (!v.written) fail("output '%s' was requested but the driver never wrote it", k.c_str());
    return 0;
  }

  [[noreturn]] static void fail(const char* fmt, ...) {
    std::fflush(stdout);
    std::fputs("msl_emu harness: error: ", stderr);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
    std::exit(2);
  }

 private:
  struct Input {
    std::string dtype, path;
    uint64_t count = 0;
    bool used = false;
  };
  struct Output {
    std::string path;
    bool written = false;
  };
  struct Scalar {
    std::string value;
    bool used = false;
  };

  template <class M, class V>
  static void add(M& m, const std::string& name, V v) {
    if (name.empty()) fail("empty argument name");
    if (!m.emplace(name, std::move(v)).second) fail("argument '%s' given twice", name.c_str());
  }
  template <class M>
  static typename M::mapped_type& find(M& m, const char* name, const char* what) {
    auto it = m.find(name);
    if (it == m.end()) fail("missing %s '%s' on the command line", what, name);
    return it->second;
  }
  static uint64_t parse_u64(const std::string& s, const char* ctx) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
    if (s.empty() || *end || errno || s[0] == '-') fail("'%s': '%s' is not an unsigned integer", ctx, s.c_str());
    return v;
  }
  template <class T>
  static T convert(const std::string& s, const char* name) {
    if constexpr (std::is_same_v<T, std::string>) {
      return s;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (s == "1" || s == "true") return true;
      if (s == "0" || s == "false") return false;
      fail("scalar '%s'='%s' is not a bool", name, s.c_str());
    } else if constexpr (std::is_integral_v<T>) {
      char* end = nullptr;
      errno = 0;
      if constexpr (std::is_signed_v<T>) {
        const long long v = std::strtoll(s.c_str(), &end, 0);
        if (s.empty() || *end || errno || v < (long long)std::numeric_limits<T>::min() ||
            v > (long long)std::numeric_limits<T>::max())
          fail("scalar '%s'='%s' is not a %s", name, s.c_str(), dtype_name<T>());
        return T(v);
      } else {
        const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
        if (s.empty() || *end || errno || s[0] == '-' || v > (unsigned long long)std::numeric_limits<T>::max())
          fail("scalar '%s'='%s' is not a %s", name, s.c_str(), dtype_name<T>());
        return T(v);
      }
    } else {
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (s.empty() || *end) fail("scalar '%s'='%s' is not a number", name, s.c_str());
      return T(v);
    }
  }

  std::map<std::string, Input> inputs_;
  std::map<std::string, Output> outputs_;
  std::map<std::string, Scalar> scalars_;
};

}  // namespace msl_emu
