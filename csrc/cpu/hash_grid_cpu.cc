// Registers the hash-grid ops' CPU kernels (csrc/cpu/hash_grid_cpu_kernels.h and the four files that instantiate
// them) and holds the choice between their ISA builds.
#include "common/isa_choice.h"
#include "cpu/hash_grid_cpu_kernels.h"

namespace {

using namespace tfmo::hash_grid::cpu;

const tfmo::OnLoad kRegister([] {
  tfmo::hash_grid::RegisterKernels("CPU", &EncodeCompute, &GradParamsCompute, &GradPositionsCompute, &SecondOrderCompute);
});

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// The builds (csrc/cpu/hash_grid_cpu_isa.h) and the choice between them, once per process, by
// TF_METAL_OPS_HASH_GRID_ISA (or TF_METAL_OPS_NO_AVX2 = default; common/isa_choice.h); diagnostics
// (tf_metal_ops.diagnostics.cpu_paths) count hot-loop calls.
TFMO_ISA_FAMILY(tfmo::hash_grid::cpu, tfmo_hash_grid_cpu_paths, "TF_METAL_OPS_HASH_GRID_ISA",
                "the hash-grid CPU kernels use", kIsaCount, "TF_METAL_OPS_NO_AVX2", "default")
