#!/usr/bin/env python
"""Start N multi-worker NeRF training processes on this machine (127.0.0.1) and watch them.

    python examples/nerf/launch_local.py --workers 2 --cores-per-worker 1 -- --quick --out runs/mw
    python examples/nerf/launch_local.py --workers 2 -- --steps 2000 --out runs/mw   # re-run: resumes

Each worker runs ``train.py --strategy multiworker [train.py args]`` with its own ``TF_CONFIG`` (free loopback
ports picked here; worker 0 is the chief). The chief's output (progress bar included) is streamed here; every
worker's output also goes to ``OUT/logs/worker-<i>.log``. With ``--cores-per-worker K`` worker i is pinned to K
of this process's CPUs (``sched_setaffinity``) and told to use K threads (``TF_METAL_OPS_NUM_THREADS``,
``TF_NUM_INTRAOP_THREADS``).

When a worker fails (non-zero exit or killed by a signal) the launcher names it, prints its last log lines,
stops every other worker (SIGTERM, then SIGKILL after ``--grace`` seconds) and exits non-zero. Workers run in
their own process groups and die with the launcher (PR_SET_PDEATHSIG), so nothing is left behind. Re-running
with the same ``--out`` resumes from ``OUT/checkpoints``.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # examples/ → `import nerf`

from nerf.distributed import local_tf_configs  # noqa: E402

TAIL_LINES = 15


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s --workers N [--cores-per-worker K] [...] -- [train.py args]")
    p.add_argument("--workers", type=int, required=True, help="number of worker processes (worker 0 is the chief)")
    p.add_argument("--cores-per-worker", type=int, default=None,
                   help="pin each worker to this many CPUs (wrapping around) and size its thread pools to it")
    p.add_argument("--timeout", type=float, default=None, help="stop everything after this many seconds (exit 124)")
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL when stopping")
    p.add_argument("--after-chief", type=float, default=120.0,
                   help="seconds the other workers may still run once the chief has finished")
    p.add_argument("--python", default=sys.executable, help="interpreter for the workers")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of train.py")
    args = p.parse_args(argv)
    if args.train_args and args.train_args[0] == "--":
        args.train_args = args.train_args[1:]
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.cores_per_worker is not None and args.cores_per_worker < 1:
        p.error("--cores-per-worker must be at least 1")
    if "--strategy" in args.train_args:
        p.error("do not pass --strategy: the launcher runs train.py --strategy multiworker")
    return args


def out_dir(train_args):
    """The run directory: train.py's --out, or a new runs/multiworker-<time> appended to the arguments."""
    for i, a in enumerate(train_args):
        if a == "--out" and i + 1 < len(train_args):
            return train_args[i + 1], train_args
        if a.startswith("--out="):
            return a.split("=", 1)[1], train_args
    out = os.path.join("runs", f"multiworker-{time.strftime('%Y%m%d-%H%M%S')}")
    return out, [*train_args, "--out", out]


def cpu_sets(n_workers, per_worker):
    cpus = sorted(os.sched_getaffinity(0))
    return [[cpus[(i * per_worker + k) % len(cpus)] for k in range(per_worker)] for i in range(n_workers)]


_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _child_setup(cpus):
    def setup():
        if _libc is not None:
            _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher, even if it is SIGKILLed
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
    return setup


class Worker:
    def __init__(self, index, proc, log_path, stream_to=None):
        self.index, self.proc, self.log_path = index, proc, log_path
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self._partial = ""
        self._log = open(log_path, "ab")
        self._stream = stream_to
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    @property
    def name(self):
        return f"worker {self.index}{' (chief)' if self.index == 0 else ''}"

    def _pump(self):
        fd = self.proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self._log.write(chunk)
            self._log.flush()
            if self._stream is not None:
                self._stream.write(chunk)
                self._stream.flush()
            text = self._partial + chunk.decode("utf-8", "replace")
            parts = text.replace("\r", "\n").split("\n")
            self._partial = parts.pop()
            self.tail.extend(p for p in parts if p.strip())
        if self._partial.strip():
            self.tail.append(self._partial)
        self._log.close()

    def last_lines(self):
        self.reader.join(timeout=2.0)
        return list(self.tail)

    def describe_exit(self):
        rc = self.proc.returncode
        if rc is None:
            return "is still running"
        if rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = f"signal {-rc}"
            return f"was killed by {sig}"
        return f"exited with code {rc}"


def stop_all(workers, grace):
    """SIGTERM every live worker's process group, then SIGKILL what is left after ``grace`` seconds."""
    live = [w for w in workers if w.proc.poll() is None]
    for w in live:
        try:
            os.killpg(w.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for w in live:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for w in workers:
        try:  # the group too: anything a worker started
            os.killpg(w.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def launch(argv=None):
    args = parse_args(argv)
    out, train_args = out_dir(args.train_args)
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    configs = local_tf_configs(args.workers, "127.0.0.1")
    cpus = cpu_sets(args.workers, args.cores_per_worker) if args.cores_per_worker else [None] * args.workers
    cmd = [args.python, "-u", os.path.join(HERE, "train.py"), "--strategy", "multiworker", *train_args]
    addrs = json.loads(configs[0])["cluster"]["worker"]
    print(f"launch_local: {args.workers} worker(s) at {', '.join(addrs)}; logs in {logs}"
          + (f"; CPUs {cpus}" if args.cores_per_worker else ""), flush=True)

    workers = []
    stopping = {"why": None}

    def on_signal(signum, frame):
        stopping["why"] = signal.Signals(signum).name
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    t0 = time.monotonic()
    chief_done = None
    try:
        for i, tf_config in enumerate(configs):
            env = dict(os.environ, TF_CONFIG=tf_config, PYTHONUNBUFFERED="1")
            if cpus[i] is not None:
                k = str(len(cpus[i]))
                env.update(TF_METAL_OPS_NUM_THREADS=k, TF_NUM_INTRAOP_THREADS=k, TF_NUM_INTEROP_THREADS=k,
                           OMP_NUM_THREADS=k)
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_child_setup(cpus[i]))
            workers.append(Worker(i, proc, os.path.join(logs, f"worker-{i}.log"),
                                  stream_to=sys.stdout.buffer if i == 0 else None))
        with open(os.path.join(logs, "pids.json.tmp"), "w") as f:
            json.dump({"launcher": os.getpid(), "workers": [w.proc.pid for w in workers]}, f)
        os.replace(os.path.join(logs, "pids.json.tmp"), os.path.join(logs, "pids.json"))

        while True:
            failed = [w for w in workers if w.proc.poll() not in (None, 0)]
            if failed:
                w = min(failed, key=lambda w: w.index)
                lines = w.last_lines()
                print(f"\nlaunch_local: error: {w.name} (pid {w.proc.pid}) {w.describe_exit()}; stopping the other "
                      f"workers. Its last log lines ({w.log_path}):", file=sys.stderr)
                for line in lines:
                    print(f"  | {line}", file=sys.stderr)
                stop_all(workers, args.grace)
                return 1
            if all(w.proc.poll() == 0 for w in workers):
                for w in workers:
                    w.reader.join(timeout=2.0)
                print(f"launch_local: all {len(workers)} worker(s) finished in {time.monotonic() - t0:.0f} s",
                      flush=True)
                return 0
            chief = workers[0]
            if chief.proc.returncode == 0:
                chief_done = chief_done or time.monotonic()
                if time.monotonic() - chief_done > args.after_chief:
                    running = [w.name for w in workers if w.proc.poll() is None]
                    print(f"\nlaunch_local: error: the chief finished {args.after_chief:.0f} s ago but "
                          f"{', '.join(running)} did not; stopping them", file=sys.stderr)
                    stop_all(workers, args.grace)
                    return 1
            if stopping["why"]:
                print(f"\nlaunch_local: {stopping['why']}: stopping all workers", file=sys.stderr)
                stop_all(workers, args.grace)
                return 130 if stopping["why"] == "SIGINT" else 143
            if args.timeout and time.monotonic() - t0 > args.timeout:
                running = [w.name for w in workers if w.proc.poll() is None]
                print(f"\nlaunch_local: error: timeout after {args.timeout:.0f} s; still running: {', '.join(running)}",
                      file=sys.stderr)
                stop_all(workers, args.grace)
                return 124
            time.sleep(0.1)
    finally:
        stop_all(workers, args.grace)  # no-op when every worker has exited; kills them on any exception
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(launch())
