#pragma once
#define FIXTURE_COMMON_ONCE 1
inline float fixture_twice(float x) { return 2.0f * x; }
