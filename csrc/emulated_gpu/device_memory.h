// Device memory of the emulated GPU.
//
// A large PROT_NONE reservation; every allocation gets its own 256-byte aligned range in it (next-fit, never reused
// until the reservation wraps), backed by host memory recorded in a side table and filled with 0xFF. Host code that
// dereferences a device address faults (fault_reporter.h names the allocation).
//
// Deallocation is stream-ordered, through epochs: a global counter D is incremented by every deallocation. Each
// item of stream work (a FIFO copy/memset, an encoded work item) registers D when it is created and unregisters it
// when it has run (or been discarded). A range deallocated at epoch d may be used by work with epoch <= d (created
// before the deallocation); its host memory is freed once the smallest registered epoch is > d. Work created after
// the deallocation cannot map it (use after free is an error message, not a crash).
//
// All functions are thread-safe (one mutex, never held while taking a stream's mutex, nor vice versa).
#pragma once

#include <stdint.h>

#include <string>

namespace tfmo_emu __attribute__((visibility("hidden"))) {

constexpr uint64_t kNoWork = ~0ull;  // the epoch of "not inside work": only live allocations resolve

inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Reserves the address range, once; its size follows TF_METAL_OPS_EMULATED_GPU_MEMORY_MB. Returns an error message or "".
std::string InitMemory();

void* AllocateDevice(uint64_t size);  // null when over the memory limit or out of address space
void DeallocateDevice(void* ptr);     // frees the host memory once no older work is pending (see above)

// Translates [addr, addr+bytes) to host memory for work of the given epoch; null with a message in *err for a
// range that is not inside one allocation usable by that work.
void* Resolve(uintptr_t addr, uint64_t bytes, uint64_t epoch, std::string* err);

uint64_t RegisterEpoch();               // the current epoch, registered as pending work
void UnregisterEpoch(uint64_t epoch);  // that work has run: frees what no pending work can use any more

struct MemoryStats {
  uint64_t limit = 0, held_bytes = 0, peak_held_bytes = 0, live_allocs = 0, live_bytes = 0, total_allocs = 0,
           total_alloc_bytes = 0, failed_allocs = 0, bad_frees = 0, largest_alloc = 0, deferred_frees = 0,
           pending_frees = 0, pending_work_items = 0, reserve_base = 0, reserve_size = 0;
};
MemoryStats GetMemoryStats();  // one consistent snapshot

// Lists up to `max_listed` allocations not yet freed (live or deferred) on stderr; returns how many there are.
int64_t ReportUnfreed(int max_listed);

// For the signal handler: async-signal-safe, never blocks.
bool InReservation(uintptr_t addr);
struct FaultAddressInfo {
  bool looked_up = false;  // the memory lock was free: the fields below are valid
  bool in_allocation = false;
  bool deallocated = false;
  uintptr_t start = 0;
  uint64_t size = 0;
};
FaultAddressInfo LookUpFaultAddress(uintptr_t addr);

}  // namespace tfmo_emu
