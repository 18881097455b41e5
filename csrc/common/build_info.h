// extern "C" build facts, read by Python through ctypes (tf_metal_ops/_library.py).
#pragma once

extern "C" __attribute__((visibility("default"))) const char* tfmo_build_info(void);
