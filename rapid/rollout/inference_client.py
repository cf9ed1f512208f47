"""A rollout worker's side of its node's inference server (``rollout.inference = "node"``): one connection per
worker, one :class:`NodeLane` per lane of its games (an :class:`rapid.rollout.inference.Inference` each).

How :func:`rapid.roles.rollout.build_worker` wires a worker to its node's server::

    client = NodeClient(folder, SlotLayout(lanes=2, rows=B·A/2, ...), spawn=start_server_process)
    lanes = Lanes([RolloutWorker(env_i, policy, settings, opponents, seed_i, inference=client.lane(i))
                   for i, env_i in enumerate(envs)])
    versions = ServerVersions(client)          # the loop's parameter source: the server is the node's reader

If no server answers, the client starts one (``spawn``) and waits for it; a server that dies mid-request costs the
worker its running games (:class:`rapid.rollout.inference.InferenceLost`), and the next request connects again,
to a server started afresh if need be. A server that cannot start is reported in one line
(:class:`rapid.errors.InferenceUnavailable`).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from rapid.errors import InferenceUnavailable
from rapid.infra.identity import env_outside_launchers
from rapid.rollout.inference import ActRequest, ActResult, InferenceLost, concat_rows
from rapid.rollout.inference_wire import BadMessage, Frames, SharedBlock, SlotLayout, connect, frame, socket_address
from rapid.run.config import Config
from rapid.run.config_files import to_toml

log = logging.getLogger(__name__)
CONFIG_NAME = "inference-config.toml"
LOG_NAME = "inference.log"


def node_folder(cfg: Config, run_id: str | None) -> Path:
    """Where a node's server and workers meet (socket, lock, server log): the node cache's folder, or with the
    cache off a folder of the node's temp dir. It must be local to the node, as the cache's is."""
    setting = cfg.rollout.node_cache_dir
    base = (Path(tempfile.gettempdir()) / f"rapid-{cfg.run.name}" if setting == "off"
            else Path(setting or os.path.join(cfg.derive().run_dir, "node-cache")))
    return base / (run_id or "run")


def spawn_server(cfg: Config, folder: Path) -> subprocess.Popen:
    """Start the node's server as a process of its own session (it outlives the worker that started it, and
    stops once idle), its log in the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / f".{CONFIG_NAME}.{os.getpid()}"
    staged.write_text(to_toml(cfg))
    os.replace(staged, folder / CONFIG_NAME)
    with open(folder / LOG_NAME, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "rapid.cli", "inference", "--config",
                                 str(folder / CONFIG_NAME)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=env_outside_launchers(os.environ))


class OpponentUnavailable(ValueError):
    """The node's server could not load a past policy (the league's loader counts it and plays the latest)."""


class NodeClient:
    def __init__(self, folder: str, layout: SlotLayout, spawn: Callable[[], subprocess.Popen] | None = None,
                 start_timeout_s: float = 120.0, log_path: str = ""):
        self.address, self.layout = socket_address(folder), layout
        self.spawn, self.start_timeout_s, self.log_path = spawn, start_timeout_s, log_path
        self.sock: socket.socket | None = None
        self.shm: SharedBlock | None = None
        self.views: list = []
        self.generation = 0
        """Connections made so far: a request of an earlier connection has no answer coming."""
        self.opponents: list[str] = []
        self._ids = itertools.count(1)
        self._frames = Frames()
        self._answers: dict[int, dict] = {}

    def lane(self, index: int) -> NodeLane:
        return NodeLane(self, index)

    def ensure(self) -> None:
        if self.sock is None:
            self._connect()

    def _connect(self) -> None:
        sock, started, deadline = None, None, time.monotonic() + self.start_timeout_s
        while sock is None:
            try:
                sock = connect(self.address)
            except (FileNotFoundError, ConnectionRefusedError):
                if self.spawn is None and time.monotonic() > deadline:
                    raise InferenceUnavailable(f"no inference server answers at {self.address!r}") from None
                if self.spawn is not None and started is None:
                    started = self.spawn()
                if started is not None and started.poll() not in (None, 0):  # 0: another server holds the node
                    raise InferenceUnavailable(f"the node's inference server could not start: {self._last_line()}")
                if time.monotonic() > deadline:
                    raise InferenceUnavailable(f"the node's inference server did not answer within "
                                               f"{self.start_timeout_s:.0f}s: {self._last_line()}") from None
                time.sleep(0.05)
        self.sock, self._frames, self._answers = sock, Frames(), {}
        self.shm = SharedBlock.create(self.layout.size)
        self.views = self.layout.views(self.shm.buf)
        self.generation += 1
        answer = self.call({"op": "hello", "shm": self.shm.path, **self.layout.to_message()})
        if "error" in answer:
            self.close()
            raise InferenceUnavailable(f"the node's inference server refused this worker: {answer['error']}")
        for member in self.opponents:  # a new server knows none of the old one's past policies
            self.call({"op": "opponent", "member": member})

    def _last_line(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
            return lines[-1] if lines else "(its log is empty)"
        except OSError:
            return "(no log)"

    def send(self, message: dict) -> int:
        self.ensure()
        assert self.sock is not None
        message["id"] = ident = next(self._ids)
        try:
            self.sock.sendall(frame(message))
        except OSError as e:
            self._lost()
            raise InferenceLost(f"cannot reach the inference server: {e}") from e
        return ident

    def wait(self, ident: int) -> dict:
        while ident not in self._answers:
            if self.sock is None:
                raise InferenceLost("the inference server went away")
            try:
                data = self.sock.recv(1 << 16)
            except OSError as e:
                self._lost()
                raise InferenceLost(f"the inference server went away: {e}") from e
            if not data:
                self._lost()
                raise InferenceLost("the inference server closed the connection")
            try:
                for answer in self._frames.feed(data):
                    self._answers[int(answer.get("id", -1))] = answer
            except BadMessage as e:
                self._lost()
                raise InferenceLost(f"garbled answer from the inference server: {e}") from e
        return self._answers.pop(ident)

    def call(self, message: dict) -> dict:
        return self.wait(self.send(message))

    def status(self, stats: bool = False) -> dict:
        """The version the server plays (and its meta); with ``stats``, its batch figures too."""
        return self.call({"op": "status", "stats": stats})

    def load_opponent(self, member_id: str) -> None:
        answer = self.call({"op": "opponent", "member": member_id})
        if "error" in answer:
            raise OpponentUnavailable(answer["error"])
        if member_id not in self.opponents:
            self.opponents.append(member_id)

    def _lost(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self._release()

    def _release(self) -> None:
        self.views = []
        if self.shm is not None:
            self.shm.unlink()  # the server has removed the name once it mapped the block; not if it never did
            self.shm.close()
            self.shm = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self._release()


class NodeLane:
    """One lane's :class:`rapid.rollout.inference.Inference` through the node's server."""

    def __init__(self, client: NodeClient, index: int):
        self.client, self.index = client, index
        self.resets: set[int] = set()
        self._waiting: tuple[int, int, int] | None = None

    def set_params(self, version: int, tensors: Mapping[str, np.ndarray]) -> None:
        """Nothing to load: the server serves the node's latest version and stamps every answer with it."""

    def _message(self, op: str, rows: np.ndarray, **fields) -> dict:
        message = {"op": op, "lane": self.index, "n": len(rows), "resets": sorted(self.resets), **fields}
        self.resets.clear()
        return message

    def submit(self, request: ActRequest) -> None:
        client = self.client
        client.ensure()
        view = client.views[self.index]
        rows = concat_rows(request.groups)
        view.rows[:len(rows)] = rows
        view.obs[rows] = request.obs[rows]
        view.mask[rows] = request.mask[rows]
        view.uniforms[rows] = request.uniforms[rows]
        groups = [[g.key, len(g.rows)] for g in request.groups]
        ident = client.send(self._message("act", rows, groups=groups))
        self._waiting = (ident, client.generation, len(rows))

    def result(self) -> ActResult:
        if self._waiting is None:
            raise RuntimeError("result() without a submit()")
        (ident, generation, n), self._waiting = self._waiting, None
        client = self.client
        if generation != client.generation:
            raise InferenceLost("the inference server that had this request is gone")
        answer = client.wait(ident)
        if "error" in answer:
            raise InferenceLost(f"the inference server refused a request: {answer['error']}")
        view = client.views[self.index]
        return ActResult(view.actions[:n].copy(), view.logp[:n].copy(), view.value[:n].copy(), view.h[:n].copy(),
                         view.c[:n].copy(), int(answer["version"]))

    def value(self, rows: np.ndarray, obs: np.ndarray) -> np.ndarray:
        client = self.client
        client.ensure()
        view = client.views[self.index]
        view.rows[:len(rows)] = rows
        view.obs[rows] = obs
        answer = client.call(self._message("value", rows))
        if "error" in answer:
            raise InferenceLost(f"the inference server refused a request: {answer['error']}")
        return view.value[:len(rows)].copy()

    def reset(self, rows: np.ndarray) -> None:
        self.resets.update(int(r) for r in rows)

    def load_opponent(self, member_id: str) -> None:
        self.client.load_opponent(member_id)


class ServerVersions:
    """The rollout loop's parameter source under node inference (in place of a worker's own poller): the versions
    the node's server plays, with their meta. A worker fetches no parameters itself."""

    def __init__(self, client: NodeClient):
        self.client = client
        self._known: int | None = None
        self._behind_s = 0.0

    def start(self) -> None:
        """Nothing runs beside the loop: each :meth:`take` asks the server."""

    def stop(self) -> None:
        """Nothing to stop."""

    def take(self) -> tuple[int, dict, dict] | None:
        try:
            status = self.client.status()
        except InferenceLost:
            return None
        self._behind_s = float(status.get("behind_s", 0.0))
        version = status.get("version")
        if version is None or version == self._known:
            return None
        self._known = int(version)
        return self._known, {}, dict(status.get("meta") or {})

    def reject(self, version: int, in_use: int | None, why: str) -> None:
        log.warning("v%d from the inference server is not playable here: %s", version, why)

    def behind_s(self) -> float:
        return self._behind_s

    def alive(self) -> bool:
        return True
