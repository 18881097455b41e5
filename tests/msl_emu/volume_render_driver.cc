// Runs metal_kernels/render.metal (VolumeRender) through the MSL emulation (csrc/msl_emu), mirroring
// csrc/gpu/render_gpu.cc: one SIMD group per ray, dispatchThreads(32 R, tg) (tg a multiple of 32), no dispatch when
// R == 0, the same VrParams, and t bound in place of an empty tensor (background [0], or anything with S == 0).
// Args: kernel=forward|backward R= S= C= bg_mode=0|1|2 threshold= [tg=64]
//   in:densities in:colors in:t in:background (float32; background may be empty)
//   backward also: in:grad_color in:grad_depth in:grad_opacity in:grad_weights
//   forward outputs:  color depth opacity weights
//   backward outputs: grad_densities grad_colors grad_t grad_background
// Outputs are pre-filled with a poison value: the kernels must write every element.
#include "harness.h"  // first: standard headers before <metal_stdlib>'s keyword macros

#include "render.metal"

static const float kPoison = 12345.0f;

// data() of v, or of `fallback` when v is empty (the host binds another buffer for an empty tensor).
static const float* Bind(const std::vector<float>& v, const std::vector<float>& fallback) {
  return v.empty() ? fallback.data() : v.data();
}
static float* BindOut(std::vector<float>& v, std::vector<float>& fallback) {
  return v.empty() ? fallback.data() : v.data();
}

int main(int argc, char** argv) {
  msl_emu::Harness h(argc, argv);
  const std::string which = h.scalar<std::string>("kernel");
  VrParams p{};
  p.R = h.scalar<uint>("R");
  p.S = h.scalar<uint>("S");
  p.C = h.scalar<uint>("C");
  p.bg_mode = h.scalar<uint>("bg_mode");
  p.threshold = h.scalar<float>("threshold");
  const uint tg = h.scalar<uint>("tg", 64);
  if (tg == 0 || tg % kVrpLanes != 0) msl_emu::Harness::fail("tg must be a multiple of 32");
  const std::vector<float> dens = h.input<float>("densities");
  const std::vector<float> cols = h.input<float>("colors");
  const std::vector<float> t = h.input<float>("t");
  const std::vector<float> bg = h.input<float>("background");
  const size_t R = p.R, S = p.S, C = p.C;
  if (dens.size() != R * S || cols.size() != R * S * C || t.size() != R * (S + 1))
    msl_emu::Harness::fail("input sizes do not match R, S, C");
  if (which == "forward") {
    std::vector<float> color(R * C, kPoison), depth(R, kPoison), opacity(R, kPoison), weights(R * S, kPoison);
    std::vector<float> scratch_out(t.size());  // stands in for an empty output buffer (never written)
    if (p.R > 0) {
      msl_emu::dispatch_threads(p.R * kVrpLanes, tg, [&](const msl_emu::ThreadCtx& c) {
        volume_render_forward(Bind(dens, t), Bind(cols, t), t.data(), Bind(bg, t), color.data(), depth.data(),
                              opacity.data(), BindOut(weights, scratch_out), p, c.thread_position_in_grid.x,
                              c.thread_index_in_simdgroup);
      });
    }
    h.output("color", color);
    h.output("depth", depth);
    h.output("opacity", opacity);
    h.output("weights", weights);
  } else if (which == "backward") {
    const std::vector<float> gc = h.input<float>("grad_color");
    const std::vector<float> gd = h.input<float>("grad_depth");
    const std::vector<float> go = h.input<float>("grad_opacity");
    const std::vector<float> gw = h.input<float>("grad_weights");
    std::vector<float> g_dens(R * S, kPoison), g_cols(R * S * C, kPoison), g_t(R * (S + 1), kPoison),
        g_bg(R * C, kPoison);
    std::vector<float> scratch_out(t.size());
    if (p.R > 0) {
      msl_emu::dispatch_threads(p.R * kVrpLanes, tg, [&](const msl_emu::ThreadCtx& c) {
        volume_render_backward(Bind(dens, t), Bind(cols, t), t.data(), Bind(bg, t), gc.data(), gd.data(), go.data(),
                               Bind(gw, t), BindOut(g_dens, scratch_out), BindOut(g_cols, scratch_out), g_t.data(),
                               g_bg.data(), p, c.thread_position_in_grid.x, c.thread_index_in_simdgroup);
      });
    }
    h.output("grad_densities", g_dens);
    h.output("grad_colors", g_cols);
    h.output("grad_t", g_t);
    h.output("grad_background", g_bg);
  } else {
    msl_emu::Harness::fail("unknown kernel %s", which.c_str());
  }
  return h.finish();
}
