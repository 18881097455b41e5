// One of several builds of a CPU kernel, chosen once per process: the best build the CPU can run, unless an
// environment variable names one (for tests and comparisons). Build 0 is the portable one, higher numbers are
// preferred. A request that cannot be honoured (an unknown name, a build not compiled in or that this CPU cannot run)
// falls back to the best runnable build below it, with a message on stderr saying why.
#pragma once

namespace tfmo {

struct IsaChoice {
  int selected;    // the build that runs
  int requested;   // from the variable; -1: unset or "auto", -2: not a known name
  bool fell_back;  // the request could not be honoured
};

struct IsaBuilds {
  const char* env;           // the variable, e.g. "TF_METAL_OPS_RAY_MARCH_ISA"
  const char* kernels;       // for messages, e.g. "the ray-march CPU kernel uses"
  const char* const* names;  // names[0 .. count): build names, "default" first
  int count;
  bool (*built)(int);        // compiled into this library
  bool (*supported)(int);    // built and runnable on this CPU
  const char* not_built;     // why a build that is not compiled in cannot run
  const char* (*lacks)(int); // why a built build cannot run on this CPU
};

IsaChoice ChooseIsa(const IsaBuilds& b);

}  // namespace tfmo
