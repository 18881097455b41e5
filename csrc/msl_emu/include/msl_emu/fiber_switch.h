// msl_emu: the context switch between the fibers of a threadgroup and their scheduler (msl_emu/runtime.h).
//
//   FiberContext c;                                    // a suspended execution context
//   fiber_prepare(c, stack, bytes, &entry);            // c starts entry() (void(), never returns) on that stack
//   fiber_switch(here, c);                             // saves the caller in `here`, resumes `c`; returns when
//                                                      // some context switches back to `here`
//
// Conventions and invariants:
//  - x86-64 (System V) and aarch64 (AAPCS64, Linux and macOS): a hand-written switch (fiber_switch_asm) that
//    saves only what a function call must preserve, on the stack of the context being left, and stores its
//    stack pointer in the FiberContext: x86-64 rbx rbp r12-r15, the MXCSR and the x87 control word (their
//    control bits are callee-saved in the SysV ABI); aarch64 x19-x29, x30 (the resume address), d8-d15 (the low
//    halves of v8-v15 are the callee-saved part) and the FPCR (rounding mode, flush-to-zero: preserved across
//    calls in AAPCS64). x18 is never touched (macOS reserves it). A switch is an ordinary call to the compiler,
//    so everything caller-saved is already spilled by the caller. No system call: the signal mask is the OS
//    thread's and stays as it is (glibc's swapcontext saves and restores it with rt_sigprocmask per switch);
//  - any other architecture, or with MSL_EMU_FIBER_UCONTEXT defined (tests compare both), or with CET shadow
//    stacks (below): ucontext (makecontext + swapcontext);
//  - a prepared context starts entry() with the stack aligned as after a call (x86-64: rsp + 8 a multiple of 16;
//    aarch64: sp a multiple of 16) and a null frame pointer, so frame-pointer unwinders (ASan's, debuggers')
//    stop there (x86-64: the return address slot is null too; aarch64: x30 is entry's own address); the FP
//    control state of a new context is the preparing thread's;
//  - x86-64 CET shadow stacks: the hand-written switch returns into another context, which a shadow stack
//    rejects, so a build with return protection (-fcf-protection=return or full: __CET__ bit 2) uses ucontext;
//  - a context must not be resumed twice without having switched out in between; a context that switched out
//    for the last time (its fiber finished) may be prepared again on the same stack.
#pragma once

#include <cstddef>
#include <cstdint>

#if (defined(__x86_64__) || defined(__aarch64__)) && !defined(MSL_EMU_FIBER_UCONTEXT) && \
    !(defined(__CET__) && (__CET__ & 2))
#define MSL_EMU_FIBER_ASM 1
#else
#include <ucontext.h>
namespace msl_emu {
[[noreturn]] inline void fatal(const char* fmt, ...);  // msl_emu/runtime.h
}
#endif

namespace msl_emu::detail {

#if defined(MSL_EMU_FIBER_ASM)

inline constexpr bool kFiberSwitchIsAsm = true;

struct FiberContext {
  void* sp = nullptr;  // while suspended: its stack pointer; the saved registers lie there (frame layout below)
};

// Stores the callee-saved state of the caller on its stack and the stack pointer in *save; loads `load` (a stack
// pointer stored by this function or laid out by fiber_prepare), restores the state saved there and returns into
// that context. Naked: the body is the whole function, there is no compiler prologue (builds with branch tracking,
// -fcf-protection=branch or -mbranch-protection=bti, still get their endbr64 / bti c landing pad from clang).
// Hidden: calls stay direct, never through a PLT.
[[gnu::naked, gnu::noinline, gnu::visibility("hidden")]] inline void fiber_switch_asm(void** /*save*/,
                                                                                      void* /*load*/) {
#if defined(__x86_64__)
  // Frame, from the stack pointer up: [0] MXCSR (low 4 bytes) and x87 control word (bytes 4-5, bytes 6-7 zero),
  // [1] r15, [2] r14, [3] r13, [4] r12, [5] rbx, [6] rbp, [7] return address. rdi = save, rsi = load. The control
  // registers are loaded only when the word differs (ldmxcsr and fldcw are slow).
  asm volatile(
      "pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "pushq $0\n\t"
      "stmxcsr (%rsp)\n\t"
      "fnstcw 4(%rsp)\n\t"
      "movq (%rsp), %rax\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "cmpq (%rsp), %rax\n\t"
      "je 1f\n\t"
      "ldmxcsr (%rsp)\n\t"
      "fldcw 4(%rsp)\n"
      "1:\n\t"
      "addq $8, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "retq\n\t");
#else
  // Frame of 176 bytes (22 words), from sp up: [0..9] x19-x28, [10] x29, [11] x30, [12..19] d8-d15, [20] FPCR,
  // [21] unused (sp stays 16-byte aligned). x0 = save, x1 = load. FPCR is written only when it differs (a write
  // can stall the pipeline).
  asm volatile(
      "sub sp, sp, #176\n\t"
      "stp x19, x20, [sp, #0]\n\t"
      "stp x21, x22, [sp, #16]\n\t"
      "stp x23, x24, [sp, #32]\n\t"
      "stp x25, x26, [sp, #48]\n\t"
      "stp x27, x28, [sp, #64]\n\t"
      "stp x29, x30, [sp, #80]\n\t"
      "stp d8, d9, [sp, #96]\n\t"
      "stp d10, d11, [sp, #112]\n\t"
      "stp d12, d13, [sp, #128]\n\t"
      "stp d14, d15, [sp, #144]\n\t"
      "mrs x9, fpcr\n\t"
      "str x9, [sp, #160]\n\t"
      "mov x10, sp\n\t"
      "str x10, [x0]\n\t"
      "mov sp, x1\n\t"
      "ldr x10, [sp, #160]\n\t"
      "cmp x9, x10\n\t"
      "b.eq 1f\n\t"
      "msr fpcr, x10\n"
      "1:\n\t"
      "ldp x19, x20, [sp, #0]\n\t"
      "ldp x21, x22, [sp, #16]\n\t"
      "ldp x23, x24, [sp, #32]\n\t"
      "ldp x25, x26, [sp, #48]\n\t"
      "ldp x27, x28, [sp, #64]\n\t"
      "ldp x29, x30, [sp, #80]\n\t"
      "ldp d8, d9, [sp, #96]\n\t"
      "ldp d10, d11, [sp, #112]\n\t"
      "ldp d12, d13, [sp, #128]\n\t"
      "ldp d14, d15, [sp, #144]\n\t"
      "add sp, sp, #176\n\t"
      "ret\n\t");
#endif
}

// Lays out, at the top of [stack, stack + bytes), the frame fiber_switch_asm restores, so that switching to `c`
// starts entry().
inline void fiber_prepare(FiberContext& c, void* stack, size_t bytes, void (*entry)()) {
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  uint64_t* p = reinterpret_cast<uint64_t*>(top);
#if defined(__x86_64__)
  uint32_t mxcsr;
  uint16_t x87cw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(x87cw));
  p -= 9;
  p[8] = 0;                                      // entry's return address: none
  p[7] = reinterpret_cast<uint64_t>(entry);      // where the switch returns to
  for (int i = 1; i <= 6; ++i) p[i] = 0;         // r15 r14 r13 r12 rbx rbp (rbp = 0: the frame chain ends)
  p[0] = uint64_t(mxcsr) | uint64_t(x87cw) << 32;
#else
  uint64_t fpcr;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  p -= 22;
  for (int i = 0; i < 22; ++i) p[i] = 0;          // x19-x28, x29 = 0 (the frame chain ends), d8-d15
  p[11] = reinterpret_cast<uint64_t>(entry);      // x30: where the switch returns to
  p[20] = fpcr;
#endif
  c.sp = p;
}

inline void fiber_switch(FiberContext& save, const FiberContext& load) { fiber_switch_asm(&save.sp, load.sp); }

#else  // ucontext

inline constexpr bool kFiberSwitchIsAsm = false;

struct FiberContext {
  ucontext_t uc{};  // zeroed: ASan's swapcontext interceptor reads uc_stack of the target
};

inline void fiber_prepare(FiberContext& c, void* stack, size_t bytes, void (*entry)()) {
  c.uc = ucontext_t{};
  if (getcontext(&c.uc) != 0) fatal("getcontext failed");
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}

inline void fiber_switch(FiberContext& save, const FiberContext& load) {
  if (swapcontext(&save.uc, &load.uc) != 0) fatal("swapcontext failed");
}

#endif

}  // namespace msl_emu::detail
