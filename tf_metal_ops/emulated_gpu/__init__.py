"""Emulated Metal GPU device for TensorFlow (msl_emu on the CPU)."""
