"""What every role needs at start-up: the run's store, the env's spec, a policy, stop signals, logs."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import zlib
from pathlib import Path

from rapid.envs.base import EnvSpec
from rapid.envs.registry import make_env
from rapid.errors import UsageError
from rapid.infra.store import InvalidKey, ObservedStore, Store, StoreError, open_store
from rapid.run.config import Config


def open_run_store(cfg: Config, metrics=None, url: str | None = None) -> Store:
    """The run's store (or the one at ``url``, with the run's store options); with a role's ``metrics``, every
    operation is counted (bytes, latency, errors)."""
    url = cfg.derive().store_url if url is None else url
    options = {}
    if url.startswith("s3://"):
        options = {"endpoint_url": cfg.store.endpoint_url or None, "region": cfg.store.region or None,
                   "max_attempts": cfg.store.max_attempts}
    try:
        store = open_store(url, **options)
    except (InvalidKey, StoreError, OSError) as e:
        raise UsageError(f"cannot open store {url}: {e}") from None
    if metrics is None:
        return store

    def observe(op: str, nbytes: int, seconds: float, ok: bool) -> None:
        if ok:
            metrics.store_op(op, nbytes, seconds)
        else:
            metrics.store_error(op)

    return ObservedStore(store, observe)


def check_run_dir(cfg: Config) -> None:
    """Refuse a run directory whose config.toml belongs to a run on another store: its logs would mix with
    this run's and `rapid eval --run-dir` would read the other store."""
    from rapid.run.config_files import load_config

    run_dir = cfg.derive().run_dir
    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        return
    try:  # a population member's run.dir names the population's folder, two above its own
        saved = load_config(path, [f"run.dir={json.dumps(cfg.run.dir or run_dir)}"]).derive().store_url
    except UsageError as e:
        raise UsageError(f"{path} is not a usable run config ({e}): pick another run.dir") from None
    if _same_store(saved) != _same_store(cfg.derive().store_url):
        raise UsageError(f"{run_dir} holds a run on store {saved}, not {cfg.derive().store_url}: set run.dir to "
                         "another folder, or leave it unset (each store then gets its own)")


def _same_store(url: str) -> str:
    """A store URL in one spelling: a local path absolute, an s3:// URL without trailing slashes."""
    if "://" in url and not url.startswith("file://"):
        return url.rstrip("/")
    return os.path.abspath(url.removeprefix("file://"))


def env_spec(cfg: Config) -> EnvSpec:
    """The env's static shape, from one throw-away game."""
    try:
        env = make_env(cfg.env.name, num_games=1, seed=0, options=cfg.env.options)
    except (ValueError, TypeError, ImportError) as e:
        raise UsageError(f"env.name={cfg.env.name!r}: {e}") from None
    spec = env.spec
    env.close()
    return spec


def build_policy(cfg: Config, spec: EnvSpec, tensors: dict | None = None):
    """The run's policy for ``spec``; with ``tensors`` (a published version or snapshot), loaded and in eval mode."""
    from rapid.opt.model import Policy

    policy = Policy(spec.obs_dim, spec.action_heads, hidden=cfg.model.hidden,
                    encoder_layers=cfg.model.encoder_layers, lstm=cfg.model.lstm, obs_clip=cfg.ppo.obs_clip,
                    grid=spec.grid, conv_channels=tuple(cfg.model.conv_channels))
    if tensors is not None:
        policy.load_tensors(tensors)
        policy.eval()
    return policy


def rollout_seed(run_seed: int, worker: str, rank: int) -> int:
    """A rollout worker's seed. Pods and job-array tasks all have rank 0: the worker's name tells their games
    apart."""
    return run_seed * 1000 + rank + 1 + zlib.crc32(worker.encode()) % 1_000_003


class StopFlag:
    """Set by SIGINT or SIGTERM (or by code); roles check it between units of work. The first reason stays.

    >>> stop = StopFlag(install_signals=False)
    >>> bool(stop), stop.wait(0.01)          # falsy while unset: pass it on with ``is None`` checks, not ``or``
    (False, False)
    >>> stop.set("updates"); stop.set("SIGINT")
    >>> bool(stop), stop.reason
    (True, 'updates')
    """

    def __init__(self, install_signals: bool = True):
        self.event = threading.Event()
        self.reason = ""
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._on_signal)
            signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.set(signal.Signals(signum).name)

    def set(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()

    def __bool__(self) -> bool:
        return self.event.is_set()

    def wait(self, seconds: float) -> bool:
        return self.event.wait(seconds)


def start_metrics(cls, cfg: Config, rank: int = 0, local_rank: int = 0, any_port: bool = False):
    """The role's metrics object; served on /metrics (and registered in the run dir) when enabled. ``any_port``:
    a free port whatever ``metrics.base_port`` says (a process beside the ranks that own base_port + local rank)."""
    # A population's members are labelled as runs of their own: run.name.m<K>.
    metrics = cls(run=cfg.run.name if cfg.pbt.member < 0 else f"{cfg.run.name}.m{cfg.pbt.member}", rank=rank)
    if cfg.metrics.enabled:
        port = cfg.metrics.base_port + local_rank if cfg.metrics.base_port and not any_port else 0
        try:
            metrics.serve(port=port, addr=cfg.metrics.addr, run_dir=cfg.derive().run_dir)
        except OSError as e:
            raise UsageError(f"cannot serve metrics on {cfg.metrics.addr}:{port}: {e.strerror}") from None
    return metrics


def setup_logging(role: str) -> logging.Logger:
    """The role's logger; the first role of a process sends the process's log records to stderr."""
    logging.basicConfig(level=os.environ.get("RAPID_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s {role} %(levelname)s %(message)s", stream=sys.stderr)
    return logging.getLogger(f"rapid.{role}")


def log_to_file(path: str | os.PathLike) -> None:
    """Every role of this process logs to ``path``, each record named by its logger (``rapid.<role>``): for
    roles that share one process, where ``setup_logging`` then adds nothing."""
    logging.basicConfig(level=os.environ.get("RAPID_LOG_LEVEL", "INFO"), filename=os.fspath(path), force=True,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


class JsonlLog:
    """Appends one JSON object per line: the run's own record, read by progress, report and tests."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)

    def write(self, record: dict) -> None:
        self._file.write(json.dumps({"time": time.time(), **record}) + "\n")

    def close(self) -> None:
        self._file.close()

