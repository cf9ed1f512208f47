"""Node inference (issue 32): the server's answers equal a worker's own (fp32 on CPU), over game resets and a
parameter swap, for the same seeds; a lost server restarts the games; a worker that leaves frees its rows; a server
that cannot start is said in one line. The server runs in a thread on a real UNIX socket and shared memory."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from rapid.envs.registry import make_env
from rapid.errors import InferenceUnavailable
from rapid.roles.startup import StopFlag, build_policy
from rapid.rollout.inference import NODE_MIN_CORES, ActResult, LocalInference, inference_mode
from rapid.rollout.inference_client import NodeClient, ServerVersions
from rapid.rollout.inference_server import InferenceServer
from rapid.rollout.inference_wire import SlotLayout, socket_address
from rapid.rollout.worker import Lanes, RolloutSettings, RolloutWorker
from rapid.run.config import Config, EnvConfig, ModelConfig, RolloutConfig

C4 = "pettingzoo.classic.connect_four_v3"


class QueuedParams:
    """A parameter source the test feeds: ``take`` hands over what was put."""

    def __init__(self):
        self.ready: queue.Queue = queue.Queue()

    def take(self):
        try:
            return self.ready.get_nowait()
        except queue.Empty:
            return None

    def behind_s(self) -> float:
        return 0.0

    def reject(self, version, in_use, why) -> None:
        raise AssertionError(why)


class Recording:
    """An Inference that keeps every answer of the one it wraps."""

    def __init__(self, inner):
        self.inner, self.answers = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def result(self) -> ActResult:
        answer = self.inner.result()
        self.answers.append(answer)
        return answer


class ServerThread:
    def __init__(self, cfg: Config, folder, spec, max_wait_s: float = 0.001, device: str = "cpu"):
        self.params = QueuedParams()
        self.server = InferenceServer(lambda: build_policy(cfg, spec), torch.device(device), self.params,
                                      lambda member: {}, max_batch=4096, max_wait_s=max_wait_s, idle_s=0)
        self.stop = StopFlag(install_signals=False)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address = socket_address(str(folder))
        if os.path.exists(address):  # a stopped server's, as the server role clears it
            os.unlink(address)
        self.listener.bind(address)
        self.listener.listen(16)
        self.thread = threading.Thread(target=self.server.serve, args=(self.listener, self.stop), daemon=True)
        self.thread.start()

    def publish(self, version: int, tensors) -> None:
        self.params.ready.put((version, tensors, {}))
        deadline = time.monotonic() + 10
        while self.server.version != version:
            assert time.monotonic() < deadline, "the server did not take the new version"
            time.sleep(0.01)

    def close(self) -> None:
        self.stop.set("test")
        self.thread.join(10)
        self.listener.close()


def _cfg(env: str, games: int, options: dict) -> Config:
    return Config(env=EnvConfig(name=env, num_games=games, options=options), model=ModelConfig(hidden=32, lstm=16),
                  rollout=RolloutConfig(bptt=4, samples_per_segment=2))


def _pair(cfg: Config, folder, seed: int = 3, device: str = "cpu"):
    """The same worker twice: one deciding on its own core, one through the node's server."""
    env_a = make_env(cfg.env.name, num_games=cfg.env.num_games, seed=seed, options=cfg.env.options)
    env_b = make_env(cfg.env.name, num_games=cfg.env.num_games, seed=seed, options=cfg.env.options)
    spec = env_a.spec
    policy = build_policy(cfg, spec)
    settings = RolloutSettings.of(cfg, spec)
    local = Recording(LocalInference(build_policy(cfg, spec), env_a.num_games * spec.num_agents))
    server = ServerThread(cfg, folder, spec, device=device)
    layout = SlotLayout(1, env_b.num_games * spec.num_agents, spec.obs_dim, spec.mask_dim, len(spec.action_heads),
                        cfg.model.lstm)
    client = NodeClient(str(folder), layout, start_timeout_s=5)
    node = Recording(client.lane(0))
    a = RolloutWorker(env_a, build_policy(cfg, spec), settings, seed=seed, inference=local)
    b = RolloutWorker(env_b, build_policy(cfg, spec), settings, seed=seed, inference=node)
    return policy, (a, local), (b, node), server, client


MOBA_5V5 = ("moba", 2, {"heroes_per_side": 5, "lanes": 3, "max_seconds": 20.0})


@pytest.mark.parametrize("env,games,options", [MOBA_5V5, (C4, 8, {})])
def test_the_servers_answers_equal_a_workers_own_over_resets_and_a_swap(tmp_path, env, games, options):
    _compare(_cfg(env, games, options), tmp_path, "cpu")


@pytest.mark.cuda
def test_a_server_on_the_gpu_answers_as_a_workers_core(tmp_path):
    """fp32 with TF32 off, as the server role sets it: within 1e-5 of the CPU over resets and a swap."""
    from rapid.opt.learner import allow_tf32

    allow_tf32(False)
    _compare(_cfg(*MOBA_5V5), tmp_path, "cuda")


def _compare(cfg: Config, folder, device: str) -> None:
    policy, (a, local), (b, node), server, client = _pair(cfg, folder, device=device)
    try:
        first = policy.tensors()
        server.publish(1, first)
        a.set_params(1, first)
        b.set_params(1, first)
        resets = 0
        for t in range(100):
            if t == 50:  # a parameter swap mid-game: new weights for the latest policy everywhere
                torch.manual_seed(9)
                swapped = build_policy(cfg, a.env.spec).tensors()
                server.publish(2, swapped)
                a.set_params(2, swapped)
            for w in (a, b):
                w.begin_step()
                w.finish_step()
            resets += int(b.step_result.done.sum())
        assert len(local.answers) == len(node.answers) == 100
        assert resets > 0, "no game ended: the test would not cross a reset"
        for i, (x, y) in enumerate(zip(local.answers, node.answers)):
            assert np.array_equal(x.actions, y.actions), f"step {i}: different actions"
            np.testing.assert_allclose(x.logp, y.logp, atol=1e-5, err_msg=f"step {i}")
            np.testing.assert_allclose(x.value, y.value, atol=1e-5, rtol=1e-5, err_msg=f"step {i}")
            np.testing.assert_allclose(x.h_before, y.h_before, atol=1e-5, err_msg=f"step {i}")
            assert x.version == y.version == (1 if i < 50 else 2)
    finally:
        client.close()
        server.close()


def _c4_node(folder, lanes: int, games: int, max_wait_s: float = 0.001):
    """A connect-four config, a server thread and a client of ``lanes`` lanes of ``games`` games each."""
    cfg = _cfg(C4, lanes * games, {})
    spec = make_env(C4, num_games=1).spec
    server = ServerThread(cfg, folder, spec, max_wait_s=max_wait_s)
    layout = SlotLayout(lanes, games * spec.num_agents, spec.obs_dim, spec.mask_dim, 1, cfg.model.lstm)
    return cfg, spec, server, NodeClient(str(folder), layout, start_timeout_s=10)


def test_lanes_step_every_game_and_the_server_batches_them(tmp_path):
    cfg, spec, server, client = _c4_node(tmp_path, lanes=2, games=4, max_wait_s=0.05)
    try:
        server.publish(4, build_policy(cfg, spec).tensors())
        settings = RolloutSettings.of(cfg, spec)
        lanes = Lanes([RolloutWorker(make_env(C4, num_games=4, seed=i), build_policy(cfg, spec), settings,
                                     seed=i, inference=client.lane(i)) for i in range(2)])
        versions = ServerVersions(client)
        assert versions.take()[0] == 4
        segments = [lanes.collect() for _ in range(4)]  # a turn-based agent decides every other step
        versions = np.concatenate([s.arrays["version"] for s in segments])
        assert len(versions) and set(versions.tolist()) == {4}
        assert segments[0].env_steps == 2 * settings.segment_steps * 4 * spec.num_agents
        s = server.server.stats.summary()
        # Both lanes' requests were waiting together at least sometimes: batches larger than one lane's rows.
        assert s["batches"] < 4 * 2 * settings.segment_steps
        assert s["passes_per_batch"] == 1.0, "every row plays the latest policy: one forward pass a batch"
    finally:
        client.close()
        server.close()


def test_a_lost_server_restarts_the_games_and_no_sample_mixes_versions(tmp_path):
    cfg, spec, server, client = _c4_node(tmp_path, lanes=1, games=4)
    worker = RolloutWorker(make_env(C4, num_games=4, seed=0), build_policy(cfg, spec),
                           RolloutSettings.of(cfg, spec), seed=0, inference=client.lane(0))
    try:
        server.publish(1, build_policy(cfg, spec).tensors())
        worker.collect()
        server.close()  # the server goes with the worker's games' states; a new one starts
        replacement = ServerThread(cfg, tmp_path, spec)
        replacement.publish(7, build_policy(cfg, spec).tensors())
        worker.begin_step()  # sent on the old connection: no answer comes
        worker.finish_step()
        assert worker.restarts == 1
        segments = [worker.collect() for _ in range(3)]
        versions = np.concatenate([s.arrays["version"] for s in segments])
        assert len(versions) and set(versions.tolist()) == {7}
        replacement.close()
    finally:
        client.close()


def test_a_worker_that_leaves_frees_its_rows(tmp_path):
    cfg = _cfg(C4, 4, {})
    spec = make_env(C4, num_games=1).spec
    server = ServerThread(cfg, tmp_path, spec)
    layout = SlotLayout(1, 8, spec.obs_dim, spec.mask_dim, 1, cfg.model.lstm)
    try:
        first = NodeClient(str(tmp_path), layout, start_timeout_s=5)
        first.status()
        first.close()  # as a killed worker's socket closes
        deadline = time.monotonic() + 5
        while server.server.workers:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second = NodeClient(str(tmp_path), layout, start_timeout_s=5)
        second.status()
        assert server.server.h.shape[0] == 8, "the second worker did not reuse the first one's rows"
        second.close()
    finally:
        server.close()


def test_a_server_that_cannot_start_is_said_in_one_line(tmp_path):
    log = tmp_path / "inference.log"

    def spawn():
        with open(log, "ab") as out:
            return subprocess.Popen([sys.executable, "-c", "print('rapid: no CUDA device on this node'); exit(2)"],
                                    stdout=out, stderr=subprocess.STDOUT)

    client = NodeClient(str(tmp_path), SlotLayout(1, 2, 3, 2, 1, 4), spawn=spawn, start_timeout_s=20,
                        log_path=str(log))
    with pytest.raises(InferenceUnavailable, match="could not start: rapid: no CUDA device on this node"):
        client.ensure()


def test_auto_inference_is_node_where_a_gpu_is_visible_and_the_server_can_have_a_core():
    """The device facts injected: BENCHMARKS.md measured node inference 1.12x per worker on 16 cores with a GPU and
    a 34% loss with two workers on two cores, so `auto` is node only on a GPU box of NODE_MIN_CORES cores or more."""
    assert NODE_MIN_CORES == 10
    assert inference_mode("auto", cuda_available=True, cores=16) == "node"
    assert inference_mode("auto", cuda_available=True, cores=NODE_MIN_CORES) == "node"
    assert inference_mode("auto", cuda_available=True, cores=NODE_MIN_CORES - 1) == "local"
    assert inference_mode("auto", cuda_available=True, cores=2) == "local"
    assert inference_mode("auto", cuda_available=False, cores=64) == "local"
    assert inference_mode("local", cuda_available=True, cores=64) == "local"
    assert inference_mode("node", cuda_available=False, cores=2) == "node"


def test_a_rollout_worker_whose_node_server_cannot_start_says_why_in_one_line(tmp_path):
    """A real `rapid rollout` starts a real `rapid inference`, which refuses a CUDA device this machine lacks."""
    from rapid.infra.store import LocalStore
    from rapid.run.store_map import write_layout
    from tests.helpers import rapid

    run = tmp_path / "run"
    write_layout(LocalStore(str(run / "store")), 1)
    out = rapid("rollout", "--set", f'run.dir="{run}"', "--set", "rollout.inference=node",
                "--set", "rollout.inference_device=cuda", "--set", "metrics.enabled=false", check=False, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1, out.stderr
    assert lines[-1].startswith("rapid: InferenceUnavailable: the node's inference server could not start: rapid: "
                                "error: rollout.inference_device = 'cuda' but this node has no CUDA device"), lines
    assert "Traceback" not in out.stderr


def test_a_batch_of_several_policies_is_one_copy_back_and_answers_as_each_policy_alone(monkeypatch):
    """Issue 59: a server batch held 3–5 policies, each its own gather, copies and wait for the device. Now every
    row's inputs go over once and every answer comes back in one copy; each policy still decides its own rows
    exactly as it would alone (answers, and the states it steps)."""
    from rapid.opt.model import Policy
    from rapid.rollout.inference_batch import Part, Staging, decide

    torch.manual_seed(0)
    policies = [Policy(obs_dim=3, action_heads=(4, 2), hidden=8, lstm=8) for _ in range(3)]
    layout = SlotLayout(1, 9, 3, 6, 2, 8)
    rng = np.random.default_rng(0)

    def lane():
        view = layout.views(bytearray(layout.size))[0]
        view.obs[:], view.mask[:] = rng.normal(size=view.obs.shape), True
        view.uniforms[:] = rng.random(view.uniforms.shape)
        return view

    together, alone = lane(), lane()
    alone.obs[:], alone.uniforms[:] = together.obs, together.uniforms
    rows = [np.array([0, 3, 6]), np.array([1, 4, 7]), np.array([2, 5, 8])]

    def parts(view, k):  # policy k's rows in two requests, answered in slots 3k and 3k + 1 … 3k + 2
        return [Part(view, position=3 * k, rows=rows[k][:1], state_rows=rows[k][:1]),
                Part(view, position=3 * k + 1, rows=rows[k][1:], state_rows=rows[k][1:])]

    h0, c0 = torch.randn(9, 8), torch.randn(9, 8)
    h1, c1 = h0.clone(), c0.clone()
    copies_back = []
    real_cpu = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: copies_back.append(1) or real_cpu(self, *a, **k))
    decide([(policies[k], parts(together, k)) for k in range(3)], h0, c0, Staging(torch.device("cpu")))
    assert len(copies_back) == 1, "one copy back for the batch's three policies"
    for k in range(3):
        decide([(policies[k], parts(alone, k))], h1, c1, Staging(torch.device("cpu")))
    for name in ("actions", "logp", "value", "h", "c"):
        assert np.array_equal(getattr(together, name), getattr(alone, name)), name
    assert torch.equal(h0, h1) and torch.equal(c0, c1)
