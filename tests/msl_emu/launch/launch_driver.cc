// Test driver of tests/test_emulated_kernel_launch.py: runs kernels by name through csrc/emulated_gpu/kernel_launch.h
// (plain C++: no msl_emu, no TensorFlow), linked with the generated glue units.
//
// Reads a script from stdin, one command per line; the LaunchDesc accumulates until `reset`:
//   kernel NAME                   grid threads|groups X Y Z         group X Y Z
//   buf SLOT SCALAR BYTES IN OUT  (IN: file to fill from or '-' = 0xAB poison; OUT: file written after launch or '-')
//   bytes SLOT BYTES IN           (setBytes data, 16-byte aligned)
//   tgmem INDEX LEN               const INDEX b|i|u|f BITS
//   check / launch                prints "check: ok" / "launch: ok" or "check: ERR <message>"
//   names                         prints "name: NAME" per kernel of the table
//   has NAME                      prints "has: 0|1"
//   atomics on|off                count the atomics of the following launches (kernel_launch.h LaunchAtomics); after
//                                 each launch, one line per buffer part and one for threadgroup memory:
//                                 "atomics: buf SLOT PARAM PART BEGIN RMW CAS CAS_FAILED LOAD STORE",
//                                 "atomics: tg RMW CAS CAS_FAILED LOAD STORE"
//   split PARAM OFFSET...         divide that buffer's counts at these byte offsets (kept until `reset`)
//   reset
// Exit status 0 unless the script is malformed (2) or msl_emu ends the process (70).
#include <cstdio>
#include <deque>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernel_launch.h"

namespace {

struct Alloc {
  void* p = nullptr;
  size_t n = 0;
  std::string out;
  ~Alloc() { std::free(p); }
};

[[noreturn]] void Die(const std::string& why) {
  std::cerr << "launch_driver: " << why << "\n";
  std::exit(2);
}

void* AllocFrom(size_t bytes, const std::string& in) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (p == nullptr) Die("out of memory");
  std::memset(p, 0xAB, bytes);
  if (in != "-") {
    std::ifstream f(in, std::ios::binary);
    if (!f.read(static_cast<char*>(p), std::streamsize(bytes))) Die("cannot read " + in);
  }
  return p;
}

std::string Result(const std::string& msg) { return msg.empty() ? "ok" : "ERR " + msg; }

}  // namespace

int main() {
  tfmo::emu::LaunchDesc d;
  tfmo::emu::LaunchAtomics atomics;
  bool count_atomics = false;
  std::string kernel;
  std::vector<std::unique_ptr<Alloc>> allocs;
  std::deque<std::string> scalars;  // keeps SlotBinding::scalar strings alive (deque: stable addresses)
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    if (!(in >> cmd)) continue;
    if (cmd == "reset") {
      d = tfmo::emu::LaunchDesc();
      atomics = tfmo::emu::LaunchAtomics();
      allocs.clear();
    } else if (cmd == "kernel") {
      in >> kernel;
      d.kernel = kernel.c_str();
    } else if (cmd == "grid") {
      std::string mode;
      in >> mode >> d.grid[0] >> d.grid[1] >> d.grid[2];
      d.threadgroups = mode == "groups";
    } else if (cmd == "group") {
      in >> d.group[0] >> d.group[1] >> d.group[2];
    } else if (cmd == "buf" || cmd == "bytes") {
      uint32_t slot;
      size_t n;
      std::string scalar = "-", src, out = "-";
      in >> slot;
      if (cmd == "buf") in >> scalar;
      in >> n >> src;
      if (cmd == "buf") in >> out;
      if (!in || slot >= tfmo::emu::kMaxBufferSlots) Die("bad line: " + line);
      auto a = std::make_unique<Alloc>();
      a->p = AllocFrom(n, src);
      a->n = n;
      a->out = out;
      tfmo::emu::SlotBinding& b = d.buffers[slot];
      b.kind = cmd == "buf" ? tfmo::emu::SlotBinding::Kind::kBuffer : tfmo::emu::SlotBinding::Kind::kBytes;
      scalars.push_back(scalar);
      b.scalar = cmd == "buf" ? scalars.back().c_str() : nullptr;
      b.bytes = n;
      b.data = a->p;
      allocs.push_back(std::move(a));
    } else if (cmd == "tgmem") {
      uint32_t i;
      size_t n;
      in >> i >> n;
      if (!in || i >= tfmo::emu::kMaxThreadgroupSlots) Die("bad line: " + line);
      d.threadgroup_memory[i] = n;
    } else if (cmd == "const") {
      tfmo::emu::ConstantValue c;
      in >> c.index >> c.type >> c.bits;
      d.constants.push_back(c);
    } else if (cmd == "check") {
      std::cout << "check: " << Result(tfmo::emu::CheckLaunch(d)) << std::endl;
    } else if (cmd == "launch") {
      const std::string r = tfmo::emu::Launch(d, count_atomics ? &atomics : nullptr);
      std::cout << "launch: " << Result(r) << std::endl;
      if (r.empty() && count_atomics) {
        auto fields = [](const tfmo::emu::AtomicCount& c) {
          return std::to_string(c.rmw) + " " + std::to_string(c.cas) + " " + std::to_string(c.cas_failed) + " " +
                 std::to_string(c.load) + " " + std::to_string(c.store);
        };
        for (const auto& b : atomics.buffers)
          for (size_t k = 0; k < b.parts.size(); ++k)
            std::cout << "atomics: buf " << b.slot << " " << b.param << " " << k << " " << b.part_begin[k] << " "
                      << fields(b.parts[k]) << "\n";
        std::cout << "atomics: tg " << fields(atomics.threadgroup) << std::endl;
      }
      if (r.empty())
        for (const auto& a : allocs)
          if (a->out != "-") {
            std::ofstream f(a->out, std::ios::binary);
            f.write(static_cast<const char*>(a->p), std::streamsize(a->n));
          }
    } else if (cmd == "atomics") {
      std::string mode;
      in >> mode;
      if (mode != "on" && mode != "off") Die("bad line: " + line);
      count_atomics = mode == "on";
    } else if (cmd == "split") {
      std::string param;
      in >> param;
      std::vector<uint64_t>& offsets = atomics.splits[param];
      offsets.clear();
      for (uint64_t off; in >> off;) offsets.push_back(off);
    } else if (cmd == "names") {
      for (const std::string& n : tfmo::emu::KernelNames()) std::cout << "name: " << n << "\n";
      std::cout.flush();
    } else if (cmd == "has") {
      std::string n;
      in >> n;
      std::cout << "has: " << tfmo::emu::HasKernel(n.c_str()) << std::endl;
    } else {
      Die("unknown command: " + line);
    }
  }
  return 0;
}
