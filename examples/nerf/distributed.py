"""Multi-worker training helpers: the cluster from ``TF_CONFIG``, checked before TensorFlow starts.

``TF_CONFIG`` is TensorFlow's standard cluster description (one JSON document per process)::

    {"cluster": {"worker": ["10.0.0.1:12345", "10.0.0.2:12345"]}, "task": {"type": "worker", "index": 0}}

Worker 0 is the chief unless the cluster has a ``"chief"`` job (one address), which is then task 0 of the
collective group. :func:`read_tf_config` turns every mistake TensorFlow would report late (or not at all: a
taken port can leave ``MultiWorkerMirroredStrategy`` waiting for peers forever) into one clear
:class:`ClusterConfigError` before the strategy is created. No TensorFlow import here: the launcher uses it too.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket

SUPPORTED_JOBS = ("chief", "worker")


class ClusterConfigError(ValueError):
    """TF_CONFIG is missing, malformed or unusable on this machine."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    task_type: str
    task_index: int
    addresses: tuple  # every task's host:port, in collective order (chief first)
    my_address: str

    @property
    def n_workers(self) -> int:
        return len(self.addresses)

    @property
    def rank(self) -> int:
        """This process's position in the collective group: 0 for the chief."""
        return self.addresses.index(self.my_address)

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def name(self) -> str:
        return f"{self.task_type} {self.task_index}"


def _split_address(addr, where):
    if not isinstance(addr, str) or ":" not in addr:
        raise ClusterConfigError(f"TF_CONFIG: {where} address {addr!r} is not host:port")
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port)
    except ValueError:
        raise ClusterConfigError(f"TF_CONFIG: {where} address {addr!r} has no numeric port") from None
    if not host or not 0 < port < 65536:
        raise ClusterConfigError(f"TF_CONFIG: {where} address {addr!r} is not host:port with a port in 1..65535")
    return host, port


def parse_tf_config(text: str | None) -> Cluster:
    """Validates the TF_CONFIG string (no network access). Raises :class:`ClusterConfigError`."""
    if text is None or not text.strip():
        raise ClusterConfigError("TF_CONFIG is not set: --strategy multiworker reads the cluster from it "
                                 "(start the workers with examples/nerf/launch_local.py, or see "
                                 "examples/nerf/README.md for one TF_CONFIG per machine)")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterConfigError(f"TF_CONFIG is not valid JSON ({e}): {text[:200]!r}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("cluster"), dict) or not isinstance(cfg.get("task"), dict):
        raise ClusterConfigError('TF_CONFIG must be a JSON object with "cluster" (job → list of host:port) and '
                                 '"task" ({"type": ..., "index": ...}) objects')
    cluster, task = cfg["cluster"], cfg["task"]
    other = sorted(set(cluster) - set(SUPPORTED_JOBS))
    if other:
        raise ClusterConfigError(f"TF_CONFIG: job(s) {other} are not supported by MultiWorkerMirroredStrategy "
                                 f"training here (only {list(SUPPORTED_JOBS)})")
    for job, addrs in cluster.items():
        if not isinstance(addrs, list):
            raise ClusterConfigError(f"TF_CONFIG: cluster[{job!r}] must be a list of host:port strings")
    chief, workers = cluster.get("chief", []), cluster.get("worker", [])
    if len(chief) > 1:
        raise ClusterConfigError(f"TF_CONFIG: the cluster has {len(chief)} chiefs; there must be exactly one")
    if not chief and not workers:
        raise ClusterConfigError('TF_CONFIG: the cluster has no chief: it needs a "chief" job with one address or '
                                 'a "worker" job whose task 0 acts as chief')
    addresses = tuple(chief) + tuple(workers)
    seen = {}
    for i, a in enumerate(addresses):
        _split_address(a, "chief" if i < len(chief) else f"worker {i - len(chief)}")
        if a in seen:
            raise ClusterConfigError(f"TF_CONFIG: address {a} appears twice in the cluster")
        seen[a] = i
    t_type, t_index = task.get("type"), task.get("index", 0)
    if t_type not in SUPPORTED_JOBS:
        raise ClusterConfigError(f"TF_CONFIG: task type {t_type!r} must be one of {list(SUPPORTED_JOBS)}")
    if not isinstance(t_index, int) or isinstance(t_index, bool):
        raise ClusterConfigError(f"TF_CONFIG: task index {t_index!r} is not an integer")
    job = cluster.get(t_type, [])
    if not 0 <= t_index < len(job):
        raise ClusterConfigError(f"TF_CONFIG: task {t_type} {t_index} is not in the cluster "
                                 f"({len(job)} {t_type} address(es))")
    return Cluster(t_type, t_index, addresses, job[t_index])


def check_port_free(address: str) -> None:
    """Raises :class:`ClusterConfigError` when this task's port cannot be bound.

    TensorFlow's gRPC server listens on every interface with SO_REUSEPORT, so it may silently share a port
    with another server instead of failing; this plain bind (no SO_REUSEPORT) catches a taken port up front.
    """
    host, port = _split_address(address, "this task's")
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers of a previous run
        s.bind(("::" if ":" in host else "0.0.0.0", port))
        s.listen(1)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ClusterConfigError(f"TF_CONFIG: port {port} of this task ({address}) is already in use by "
                                     "another process; pick a free port (launch_local.py picks them for you)") from None
        raise ClusterConfigError(f"TF_CONFIG: cannot listen on port {port} of this task ({address}): {e}") from None
    finally:
        s.close()


def read_tf_config(environ=None, check_port: bool = True) -> Cluster:
    """Parses ``TF_CONFIG`` from ``environ`` (default os.environ) and checks that this task's port is free."""
    environ = os.environ if environ is None else environ
    cluster = parse_tf_config(environ.get("TF_CONFIG"))
    if check_port:
        check_port_free(cluster.my_address)
    return cluster


def free_ports(n: int, host: str = "127.0.0.1") -> list:
    """``n`` distinct ports the OS reports free on ``host`` right now (bound to port 0, then released)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def local_tf_configs(n_workers: int, host: str = "127.0.0.1", ports=None) -> list:
    """One TF_CONFIG JSON string per worker of an ``n_workers`` cluster on ``host`` (worker 0 is the chief)."""
    ports = ports or free_ports(n_workers, host)
    addrs = [f"{host}:{p}" for p in ports]
    return [json.dumps({"cluster": {"worker": addrs}, "task": {"type": "worker", "index": i}})
            for i in range(n_workers)]
