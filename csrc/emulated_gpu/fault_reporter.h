// The fault reporter of the emulated GPU: when host code dereferences device memory (device_memory.h), a
// SIGSEGV/SIGBUS handler names the address and its allocation on stderr, then lets the fault kill the process with
// the default action. Faults outside the reservation go to the handler installed before.
#pragma once

namespace tfmo_emu __attribute__((visibility("hidden"))) {

// Installs the handlers, once; call after InitMemory() succeeded.
void InstallFaultReporter();

}  // namespace tfmo_emu
