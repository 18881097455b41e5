#!/usr/bin/env python3
"""Plants single defects into a scratch copy of csrc/metal, one at a time, builds the metal backend over the Apple
doubles from that copy, and runs the checks that should catch each defect on each stream kind. A defect is caught
when one of its checks fails (the doubles end the process, or the check's assertion fails); the table says which.

    TF_METAL_OPS_OBJC_RUNTIME=... python dev/plant_defects.py [--only NAME] [--every] [--keep DIR]

Needs the package installed (tests import it) and clang++-16 (TF_METAL_OPS_CLANGXX). A development tool: slow
(one backend build per defect, about 2 minutes here), not part of CI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAIN, MPS, DEFERRED = {}, {"TFMO_MOCK_TF_METAL_STREAM": "mps"}, {"TFMO_MOCK_TF_METAL_STREAM": "deferred"}
STREAMS = {"plain": PLAIN, "mps": MPS}
BOUNDS = {"TF_METAL_OPS_BOUNDS_CHECK": "1"}
SHORT_WAIT = {"TF_METAL_OPS_GPU_TIMEOUT": "30"}

# (name, file under csrc/metal, text, replacement (or lists of both, replaced pairwise), checks: (script, check,
# extra environment) tried in order until one fails, streams)
DEFECTS = [
    ("completion handler added after commit", "backend.mm",
     """            metal::AddCompletionHandler(cb, completion, /*report_async=*/!wait, op_name);
            if (wait) {
              [stream commitAndWait];
            } else {
              [stream commit];
            }""",
     """            if (wait) {
              [stream commitAndWait];
            } else {
              [stream commit];
            }
            metal::AddCompletionHandler(cb, completion, /*report_async=*/!wait, op_name);""",
     [("emulated_gpu_checks", "volume_render", {}),
      ("metal_backend_checks", "gpu_error_reported_on_next_call", BOUNDS)], STREAMS),
    ("setBytes of 5,000 bytes", "encode.mm",
     """      if (b.kind == Binding::Kind::kBytes) [enc setBytes:b.data.data() length:b.data.size() atIndex:i];""",
     """      static const char big[5000] = {};
      if (b.kind == Binding::Kind::kBytes) [enc setBytes:big length:sizeof big atIndex:i];""",
     [("emulated_gpu_checks", "volume_render", {})], STREAMS),
    ("scratch freed in a completion handler", "backend.mm",
     ["""      scratch = call.TakeScratch();""",
      """            metal::AddCompletionHandler(cb, completion, /*report_async=*/!wait, op_name);"""],
     ["""      const std::vector<TF_Tensor*> doomed = call.TakeScratch();""",
      """            metal::AddCompletionHandler(cb, completion, /*report_async=*/!wait, op_name);
            [cb addCompletedHandler:^(id<MTLCommandBuffer>) {
              for (TF_Tensor* t : doomed) TF_DeleteTensor(t);
            }];"""],
     [("metal_backend_checks", "scratch_freed", {})], STREAMS),
    ("no endEncoding", "encode.mm",
     """  EncodePasses(enc, passes);
  [enc endEncoding];""",
     """  EncodePasses(enc, passes);""",
     [("emulated_gpu_checks", "volume_render", {})], STREAMS),
    ("fastMathEnabled = YES for runtime-compiled sources", "device.mm",
     """  options.fastMathEnabled = NO;""", """  options.fastMathEnabled = YES;""",
     [("metal_backend_checks", "ieee_semantics_in_runtime_compiled_sources", {}),
      ("emulated_gpu_checks", "hash_grid", {"TFMO_MOCK_METAL_METALLIB_UNLOADABLE": "1"})], STREAMS),
    ("encoding on the stream outside its dispatch queue", "backend.mm",
     """      dispatch_sync(queue, ^{
        @autoreleasepool {
          @try {
            id<MTLCommandBuffer> cb = metal::EncodeCompute(""",
     """      dispatch_sync(dispatch_queue_create("not the stream's queue", DISPATCH_QUEUE_SERIAL), ^{
        @autoreleasepool {
          @try {
            id<MTLCommandBuffer> cb = metal::EncodeCompute(""",
     [("emulated_gpu_checks", "zero_out", {})], STREAMS),
    ("read-back waits after a -commit that may not submit", "backend.mm",
     """            metal::AddCompletionHandler(cb, completion, /*report_async=*/false, op_name);
            [stream commitAndWait];""",
     """            metal::AddCompletionHandler(cb, completion, /*report_async=*/false, op_name);
            [stream commit];""",
     [("emulated_gpu_checks", "ray_march", SHORT_WAIT)], {"deferred": DEFERRED}),
]


def scratch_copy(dest: Path) -> None:
    for d in ("csrc", "metal_kernels", "dev"):
        shutil.copytree(REPO / d, dest / d, ignore=shutil.ignore_patterns("__pycache__"))


def build(root: Path) -> str:
    r = subprocess.run([sys.executable, str(root / "dev" / "apple_doubles" / "build.py")], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"building the planted copy failed:\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


def run_check(backend: str, script: str, check: str, env: dict) -> tuple[bool, str, float]:
    """(passed, last line of its output, seconds)."""
    full = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore", "TF_METAL_OPS_EMULATED_GPU": backend,
            **env, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO / "examples")])}
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", f"support.{script}", check], capture_output=True, text=True,
                           env=full, cwd=REPO / "tests", timeout=300)
        out = (r.stdout + r.stderr).strip().splitlines()
        passed = r.returncode == 0 and bool(r.stdout.strip()) and r.stdout.strip().splitlines()[-1].startswith(
            f"ok {check}")
        why = r.stdout.strip().splitlines()[-1] if passed else next(
            (line for line in reversed(out) if "failed assertion" in line or "BUG IN CLIENT" in line
             or "Error" in line or "tensorflow-metal double" in line or "Apple doubles" in line), out[-1] if out else "")
    except subprocess.TimeoutExpired:
        passed, why = False, "timed out after 300 s"
    return passed, why.strip()[:160], time.monotonic() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run only the defect whose name contains this text")
    ap.add_argument("--keep", help="build the scratch copies under this directory and keep them")
    ap.add_argument("--every", action="store_true", help="run every check of a defect, not only until one fails")
    args = ap.parse_args(argv)
    rows, missed = [], 0
    for name, file, text, replacement, checks, streams in DEFECTS:
        if args.only and args.only not in name:
            continue
        with tempfile.TemporaryDirectory(dir=args.keep) as tmp:
            root = Path(tmp)
            scratch_copy(root)
            path = root / "csrc" / "metal" / file
            source = path.read_text()
            pairs = zip(text, replacement) if isinstance(text, list) else [(text, replacement)]
            for old, new in pairs:
                if source.count(old) != 1:
                    raise SystemExit(f"{name}: the text to replace occurs {source.count(old)} times in {file}")
                source = source.replace(old, new)
            path.write_text(source)
            t0 = time.monotonic()
            backend = build(root)
            print(f"# {name}: built in {time.monotonic() - t0:.0f} s", flush=True)
            for stream, stream_env in streams.items():
                caught = None
                for script, check, env in checks:
                    passed, why, secs = run_check(backend, script, check, {**stream_env, **env})
                    print(f"#   {stream}: {script} {check}: {'passed' if passed else 'FAILED'} ({secs:.0f} s) {why}",
                          flush=True)
                    if not passed and caught is None:
                        caught = (f"{check}{' ' + ' '.join(f'{k}={v}' for k, v in env.items()) if env else ''}", why)
                    if caught is not None and not args.every:
                        break
                missed += caught is None
                rows.append((name, stream, caught))
    print("\n| planted defect | stream | caught by | how |\n|---|---|---|---|")
    for name, stream, caught in rows:
        print(f"| {name} | {stream} | {caught[0] if caught else '**not caught**'} | {caught[1] if caught else ''} |")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
