// Small Foundation helpers shared by the Metal backend's files (csrc/metal/*.mm): strings for op errors and
// environment switches. Objective-C++ only.
#pragma once

#import <Foundation/Foundation.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace tfmo::metal {

inline std::string ToString(NSString* s) { return s ? std::string(s.UTF8String ?: "") : std::string(); }

// An NSError as op-error text; compiler logs can be long, so the message keeps their head.
inline std::string Describe(NSError* e) {
  if (!e) return "unknown error";
  std::string s = ToString(e.localizedDescription);
  constexpr size_t kMax = 4000;
  if (s.size() > kMax) s = s.substr(0, kMax) + " [...]";
  return s;
}

inline std::string ExceptionMessage(NSException* e) {
  return "Objective-C exception " + ToString(e.name) + ": " + ToString(e.reason);
}

inline bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

}  // namespace tfmo::metal
