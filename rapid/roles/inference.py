"""The node inference role: all the wiring of one node's inference server, top to bottom
(``rapid inference``; started by the node's first rollout worker under node inference, or by `rapid train`).

One server per node: it holds the node's lock file beside its socket, so a second one started at the same time
says so and exits 0. It stops when told, or once no worker has been connected for ``rollout.inference_idle_s``.
"""

from __future__ import annotations

import fcntl
import os
import socket

import torch

from rapid.errors import UsageError
from rapid.league import League
from rapid.monitoring.inference_metrics import InferenceMetrics
from rapid.opt.learner import allow_tf32
from rapid.roles.rollout import ParamPoller, run_layout
from rapid.roles.startup import StopFlag, build_policy, env_spec, open_run_store, setup_logging, start_metrics
from rapid.rollout.inference_client import node_folder
from rapid.rollout.inference_server import InferenceServer
from rapid.rollout.inference_wire import LOCK_NAME, socket_address
from rapid.rollout.node_cache import rollout_store
from rapid.run.config import Config
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import shard_of


def inference_device(setting: str, cuda_available: bool) -> torch.device:
    """The server's device for ``rollout.inference_device``: ``auto`` is the node's GPU where one is visible.

    >>> inference_device("auto", False), inference_device("auto", True)
    (device(type='cpu'), device(type='cuda'))
    """
    if setting == "cuda" and not cuda_available:
        raise UsageError("rollout.inference_device = 'cuda' but this node has no CUDA device")
    return torch.device("cuda" if setting == "cuda" or (setting == "auto" and cuda_available) else "cpu")


def run_inference_server(cfg: Config, stop: StopFlag | None = None, idle_s: float | None = None) -> int:
    """``idle_s``: stop once no worker has been connected this long (None: ``rollout.inference_idle_s``; 0: never)."""
    log = setup_logging("inference")
    stop = StopFlag() if stop is None else stop
    torch.set_num_threads(cfg.rollout.torch_threads)
    device = inference_device(cfg.rollout.inference_device, torch.cuda.is_available())
    if device.type == "cuda":
        allow_tf32(False)  # the workers' log-probs must match the learner's to about 1e-5 (see precision_settings)
    # One server per node: its metrics rank is the node's (a stable hash of the host name, as a pod's worker name is
    # hashed), and its port any free one, since the node's rank-0 process owns metrics.base_port.
    metrics = start_metrics(InferenceMetrics, cfg, rank=shard_of(socket.gethostname(), 1 << 30), any_port=True)
    store = open_run_store(cfg, metrics)
    layout = run_layout(store, stop, log)
    if layout is None:
        return 0
    _, run_id = layout
    folder = node_folder(cfg, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another inference server holds this node (%s)", folder)
            return 0
        address = socket_address(str(folder))
        if not address.startswith("\0") and os.path.exists(address):
            os.unlink(address)  # a dead server's; the lock says none is alive
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(1024)
        reads = rollout_store(store, cfg.derive().run_dir, run_id, cfg.rollout.node_cache_dir,
                              cfg.rollout.param_poll_s, cfg.league.refresh_s)
        spec = env_spec(cfg)
        poller = ParamPoller(ParameterStore(reads), cfg.rollout.param_poll_s, log)
        league = League(reads)
        server = InferenceServer(lambda: build_policy(cfg, spec), device, poller,
                                 lambda member: league.load_snapshot(member).tensors, cfg.rollout.inference_max_batch,
                                 cfg.rollout.inference_max_wait_ms / 1000.0, metrics,
                                 idle_s=cfg.rollout.inference_idle_s if idle_s is None else idle_s)
        poller.start()
        log.info("inference server on %s for %s (pid %d, %s): batches of up to %d rows, waits up to %g ms",
                 device, folder, os.getpid(), address.lstrip("\0"), cfg.rollout.inference_max_batch,
                 cfg.rollout.inference_max_wait_ms)
        try:
            server.serve(listener, stop)
        finally:
            poller.stop()
            listener.close()
            if not address.startswith("\0") and os.path.exists(address):
                os.unlink(address)
            metrics.close()
            s = server.stats.summary()
            log.info("inference server stopped: %d batches, %d rows (mean batch %.1f, %.2f forward passes each), "
                     "wait p50 %.2f ms p99 %.2f ms, busy %.0f%%", s["batches"], s["rows"], s["mean_batch"],
                     s["passes_per_batch"], s["wait_p50_ms"], s["wait_p99_ms"], 100 * s["busy_share"])
    return 0
