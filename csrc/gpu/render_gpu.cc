// GPU kernel hosts of Volume_render, Volume_render_grad, Distortion_loss, Distortion_loss_grad
// (semantics: csrc/ops/render_op.cc; kernels: metal_kernels/render.metal).
// Shapes are validated here exactly as on the CPU (render_args.h). Value checks (sorted t, densities >= 0)
// happen per ray on the GPU, which cannot fail the op: offending rays get NaN outputs (documented in the
// kernels and in tf_metal_ops/render/__init__.py).
// Empty tensors have no MTLBuffer: an empty input or output is bound as `t` (never empty when R > 0: it has
// S + 1 >= 1 columns); the kernels never touch it because the matching loops are empty. R == 0 skips the dispatch.
#include "common/op_names.h"
#include "common/tfc.h"
#include "gpu/gpu_host.h"
#include "ops/render_args.h"
#include "shared/render_math.h"

namespace {

using tfmo::TensorRef;

using tfmo::render::VrAttrs;

// Binds t at `index`, or `fallback` when t is empty (see the header comment).
void BindOr(tfmo::gpu::Pass& p, uint32_t index, const TensorRef& t, const TensorRef& fallback) {
  p.buffer(index, t.num_elements() > 0 ? t : fallback);
}

// The kernels index rays, samples (r S + i) and the grid's threads with 32-bit uints (their other offsets are 64-bit).
bool CheckDims(TF_OpKernelContext* ctx, const char* op, int64_t R, int64_t S, int64_t C) {
  return tfmo::gpu::CheckGridSize(ctx, op, "the threads (32 per ray)", static_cast<uint64_t>(R) * kVrpLanes) &&
         tfmo::gpu::CheckGridSize(ctx, op, "the number of interval edges", static_cast<uint64_t>(R) * (S + 1)) &&
         tfmo::gpu::CheckGridSize(ctx, op, "the number of channels", static_cast<uint64_t>(C));
}

// One SIMD group per ray: kVrpLanes * R threads in threadgroups of kVrpRayGroup (clipped to the grid, itself a
// multiple of kVrpLanes), the layout metal_kernels/render.metal requires.
void RayThreads(tfmo::gpu::Pass& p, int64_t R) { p.threads(static_cast<uint64_t>(R) * kVrpLanes, kVrpRayGroup); }

VrParams MakeVrParams(const tfmo::render::VrDims& d, float threshold) {
  return VrParams{static_cast<uint32_t>(d.R), static_cast<uint32_t>(d.S), static_cast<uint32_t>(d.C),
                  static_cast<uint32_t>(d.bg), threshold};
}

// Slots 0-3 of both volume-render kernels: densities, colors, t, background.
void BindVrInputs(tfmo::gpu::Pass& p, const TensorRef& dens, const TensorRef& cols, const TensorRef& t,
                  const TensorRef& bg) {
  BindOr(p, 0, dens, t);
  BindOr(p, 1, cols, t);
  p.buffer(2, t);
  BindOr(p, 3, bg, t);
}

void VrGpu(void* attrs, TF_OpKernelContext* ctx) {
  const char* op = "volume_render";
  TensorRef dens, cols, t, bg;
  if (!tfmo::GetInput(ctx, 0, &dens) || !tfmo::GetInput(ctx, 1, &cols) || !tfmo::GetInput(ctx, 2, &t) ||
      !tfmo::GetInput(ctx, 3, &bg))
    return;
  tfmo::render::VrDims d;
  if (!tfmo::render::ValidateVolumeRender(ctx, op, dens, cols, t, bg, &d)) return;
  TensorRef color, depth, opacity, weights;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {d.R, d.C}, &color) ||
      !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {d.R}, &depth) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {d.R}, &opacity) ||
      !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {d.R, d.S}, &weights))
    return;
  if (d.R == 0 || !CheckDims(ctx, op, d.R, d.S, d.C)) return;
  const VrParams params = MakeVrParams(d, static_cast<VrAttrs*>(attrs)->threshold);
  tfmo::gpu::Call call(ctx, op);
  tfmo::gpu::Pass& p = call.pass("volume_render_forward");
  BindVrInputs(p, dens, cols, t, bg);
  p.buffer(4, color);
  p.buffer(5, depth);
  p.buffer(6, opacity);
  BindOr(p, 7, weights, t);
  p.value(8, params);
  RayThreads(p, d.R);
  call.Run();
}

void VrGradGpu(void* attrs, TF_OpKernelContext* ctx) {
  const char* op = "volume_render_grad";
  TensorRef in[8];
  for (int i = 0; i < 8; ++i)
    if (!tfmo::GetInput(ctx, i, &in[i])) return;
  const TensorRef &dens = in[0], &cols = in[1], &t = in[2], &bg = in[3];
  tfmo::render::VrDims d;
  if (!tfmo::render::ValidateVolumeRender(ctx, op, dens, cols, t, bg, &d) ||
      !tfmo::render::ValidateVolumeRenderUpstream(ctx, op, d, in[4], in[5], in[6], in[7]))
    return;
  TensorRef g_dens, g_cols, g_t, g_bg;
  if (!tfmo::AllocateOutput(ctx, 0, TF_FLOAT, {d.R, d.S}, &g_dens) ||
      !tfmo::AllocateOutput(ctx, 1, TF_FLOAT, {d.R, d.S, d.C}, &g_cols) ||
      !tfmo::AllocateOutput(ctx, 2, TF_FLOAT, {d.R, d.S + 1}, &g_t) ||
      !tfmo::AllocateOutput(ctx, 3, TF_FLOAT, {d.R, d.C}, &g_bg))
    return;
  if (d.R == 0 || !CheckDims(ctx, op, d.R, d.S, d.C)) return;
  const VrParams params = MakeVrParams(d, static_cast<VrAttrs*>(attrs)->threshold);
  tfmo::gpu::Call call(ctx, op);
  tfmo::gpu::Pass& p = call.pass("volume_render_backward");
  BindVrInputs(p, dens, cols, t, bg);
  p.buffer(4, in[4]);
  p.buffer(5, in[5]);
  p.buffer(6, in[6]);
  BindOr(p, 7, in[7], t);
  BindOr(p, 8, g_dens, g_t);
  BindOr(p, 9, g_cols, g_t);
  p.buffer(10, g_t);
  p.buffer(11, g_bg);
  p.value(12, params);
  RayThreads(p, d.R);
  call.Run();
}

// The distortion-loss kernels' pass: slots 0-1 weights and t, the last slot (`params_slot`) their DlParams.
tfmo::gpu::Pass& DlPass(tfmo::gpu::Call& call, const char* kernel, const TensorRef& w, const TensorRef& t,
                        int64_t R, int64_t S, uint32_t params_slot) {
  tfmo::gpu::Pass& p = call.pass(kernel);
  BindOr(p, 0, w, t);
  p.buffer(1, t);
  p.value(params_slot, DlParams{static_cast<uint32_t>(R), static_cast<uint32_t>(S)});
  RayThreads(p, R);
  return p;
}

void DlGpu(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss";
  TensorRef w, t, loss;
  int64_t R = 0, S = 0;
  if (!tfmo::render::PrepareDistortionLoss(ctx, op, &w, &t, &loss, &R, &S)) return;
  if (R == 0 || !CheckDims(ctx, op, R, S, 1)) return;
  tfmo::gpu::Call call(ctx, op);
  DlPass(call, "distortion_loss_forward", w, t, R, S, 3).buffer(2, loss);
  call.Run();
}

void DlGradGpu(void*, TF_OpKernelContext* ctx) {
  const char* op = "distortion_loss_grad";
  TensorRef w, t, g, gw, gt;
  int64_t R = 0, S = 0;
  if (!tfmo::render::PrepareDistortionLossGrad(ctx, op, &w, &t, &g, &gw, &gt, &R, &S)) return;
  if (R == 0 || !CheckDims(ctx, op, R, S, 1)) return;
  tfmo::gpu::Call call(ctx, op);
  tfmo::gpu::Pass& p = DlPass(call, "distortion_loss_backward", w, t, R, S, 5);
  p.buffer(2, g);
  BindOr(p, 3, gw, gt);
  p.buffer(4, gt);
  call.Run();
}

const tfmo::OnLoad kRegister([] {
  tfmo::render::RegisterKernels("GPU", &VrGpu, &VrGradGpu, &DlGpu, &DlGradGpu);
});

}  // namespace
