// Runs metal_kernels/render.metal (DistortionLoss) through the MSL emulation (csrc/msl_emu), mirroring
// csrc/gpu/render_gpu.cc: one SIMD group per ray, dispatchThreads(32 R, tg) (tg a multiple of 32), no dispatch when
// R == 0, t bound in
// place of an empty weights tensor (S == 0).
// Args: kernel=forward|backward R= S= [tg=64]  in:weights in:t (float32)  backward also in:grad_loss
//   forward output: loss; backward outputs: grad_weights grad_t. Outputs are pre-filled with a poison value.
#include "harness.h"  // first: standard headers before <metal_stdlib>'s keyword macros

#include "render.metal"

static const float kPoison = 12345.0f;

int main(int argc, char** argv) {
  msl_emu::Harness h(argc, argv);
  const std::string which = h.scalar<std::string>("kernel");
  DlParams p{};
  p.R = h.scalar<uint>("R");
  p.S = h.scalar<uint>("S");
  const uint tg = h.scalar<uint>("tg", 64);
  if (tg == 0 || tg % kVrpLanes != 0) msl_emu::Harness::fail("tg must be a multiple of 32");
  const std::vector<float> w = h.input<float>("weights");
  const std::vector<float> t = h.input<float>("t");
  const size_t R = p.R, S = p.S;
  if (w.size() != R * S || t.size() != R * (S + 1)) msl_emu::Harness::fail("input sizes do not match R, S");
  const float* w_in = w.empty() ? t.data() : w.data();
  if (which == "forward") {
    std::vector<float> loss(R, kPoison);
    if (p.R > 0) {
      msl_emu::dispatch_threads(p.R * kVrpLanes, tg, [&](const msl_emu::ThreadCtx& c) {
        distortion_loss_forward(w_in, t.data(), loss.data(), p, c.thread_position_in_grid.x,
                              c.thread_index_in_simdgroup);
      });
    }
    h.output("loss", loss);
  } else if (which == "backward") {
    const std::vector<float> g = h.input<float>("grad_loss");
    std::vector<float> gw(R * S, kPoison), gt(R * (S + 1), kPoison);
    std::vector<float> scratch_out(t.size());  // stands in for an empty grad_weights buffer (never written)
    if (p.R > 0) {
      msl_emu::dispatch_threads(p.R * kVrpLanes, tg, [&](const msl_emu::ThreadCtx& c) {
        distortion_loss_backward(w_in, t.data(), g.data(), gw.empty() ? scratch_out.data() : gw.data(), gt.data(),
                                 p, c.thread_position_in_grid.x,
                              c.thread_index_in_simdgroup);
      });
    }
    h.output("grad_weights", gw);
    h.output("grad_t", gt);
  } else {
    msl_emu::Harness::fail("unknown kernel %s", which.c_str());
  }
  return h.finish();
}
