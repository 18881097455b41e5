#pragma once
#include "common.h"
inline float fixture_nested(float x) { return fixture_twice(x) + 1.0f; }
