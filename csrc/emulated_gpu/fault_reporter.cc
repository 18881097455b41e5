// The SIGSEGV/SIGBUS reporter of the emulated GPU (fault_reporter.h). The handler is async-signal-safe: write(2),
// sigaction, and a look-up that only try-locks the memory table.
#include "fault_reporter.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <mutex>

#include "device_memory.h"
#include "device_messages.h"

namespace tfmo_emu __attribute__((visibility("hidden"))) {
namespace {

struct sigaction g_old_segv, g_old_bus;

size_t AppendStr(char* buf, size_t pos, size_t cap, const char* s) {
  while (*s && pos + 1 < cap) buf[pos++] = *s++;
  return pos;
}

size_t AppendHex(char* buf, size_t pos, size_t cap, uint64_t v) {
  char tmp[19];
  int n = 0;
  do {
    tmp[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  pos = AppendStr(buf, pos, cap, "0x");
  while (n > 0 && pos + 1 < cap) buf[pos++] = tmp[--n];
  return pos;
}

size_t AppendDec(char* buf, size_t pos, size_t cap, uint64_t v) {
  char tmp[21];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (n > 0 && pos + 1 < cap) buf[pos++] = tmp[--n];
  return pos;
}

void WriteAll(const char* buf, size_t n) {
  while (n > 0) {
    ssize_t w = write(2, buf, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    buf += w;
    n -= static_cast<size_t>(w);
  }
}

// Restores the default action: returning from the handler re-executes the fault, and the process dies by `sig`.
void RestoreDefault(int sig) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
}

void FaultHandler(int sig, siginfo_t* info, void* ucontext) {
  uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  if (InReservation(addr)) {
    int saved_errno = errno;
    char buf[512];
    size_t cap = sizeof buf, p = 0;
    p = AppendStr(buf, p, cap, kPrefix);
    p = AppendStr(buf, p, cap, "host code dereferenced device memory at ");
    p = AppendHex(buf, p, cap, addr);
    FaultAddressInfo a = LookUpFaultAddress(addr);
    if (a.looked_up && a.in_allocation) {
      p = AppendStr(buf, p, cap, " (an allocation of ");
      p = AppendDec(buf, p, cap, a.size);
      p = AppendStr(buf, p, cap, " bytes at ");
      p = AppendHex(buf, p, cap, a.start);
      p = AppendStr(buf, p, cap, a.deallocated ? ", already deallocated)" : ")");
    } else if (a.looked_up) {
      p = AppendStr(buf, p, cap, " (not inside a live allocation)");
    }
    p = AppendStr(buf, p, cap, ": GPU kernels must not read tensor data on the host; use the stream's map() inside "
                               "work, or copy the tensor to the host\n");
    WriteAll(buf, p);
    errno = saved_errno;
    RestoreDefault(sig);
    return;
  }
  // Not ours: chain to the handler that was installed before.
  const struct sigaction& old = sig == SIGBUS ? g_old_bus : g_old_segv;
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction != nullptr) {
      old.sa_sigaction(sig, info, ucontext);
      return;
    }
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN && old.sa_handler != nullptr) {
    old.sa_handler(sig);
    return;
  }
  RestoreDefault(sig);
}

}  // namespace

void InstallFaultReporter() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = FaultHandler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
  });
}

}  // namespace tfmo_emu
