// Per-element math of the robust photometric loss, written once for the CPU kernel (C++) and the Metal kernel (MSL):
// the Charbonnier penalty rho(d) = sqrt(d^2 + eps^2) - eps of a residual d = prediction - target, and its derivative
// rho'(d) = d / sqrt(d^2 + eps^2). eps > 0 keeps it smooth at 0; it is ~|d| for |d| >> eps (robust to outliers).
#pragma once

#include "device_compat.h"

TFMO_FN float rl_penalty(float d, float eps) { return tfmo_sqrt(d * d + eps * eps) - eps; }
TFMO_FN float rl_derivative(float d, float eps) { return d / tfmo_sqrt(d * d + eps * eps); }

// Kernel arguments (setBytes), identical in C++ and MSL: rows N, channels C, eps.
struct RlArgs {
  uint rows;
  uint channels;
  float eps;
};
