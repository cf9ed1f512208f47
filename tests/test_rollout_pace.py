"""Issue 59: back-pressure. A rollout worker plays the share of its time the version it plays asks for (the
optimizer's pace), pausing after each segment, and takes the newest version after the pause, not before it (a
version a pause old would make the next segment stale on arrival)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from rapid.roles.rollout_loop import RolloutLoop
from rapid.roles.startup import StopFlag
from tests.test_rollout_linger import FakeClock


class Worker:
    """Plays a segment in 2 simulated seconds, stamped with the version it plays."""

    def __init__(self, clock):
        self.clock, self.version, self.played = clock, None, []

    def collect(self):
        self.clock.now += 2.0
        self.played.append((self.clock.now, self.version))
        return SimpleNamespace(env_steps=10, episodes=[])

    def set_params(self, version, tensors, meta):
        self.version = version


class Poller:
    """A new version every 5 s, each carrying the pace ``pace``."""

    def __init__(self, clock, pace):
        self.clock, self.pace, self.given = clock, pace, -1

    def take(self):
        newest = int(self.clock.now // 5)
        if newest == self.given:
            return None
        self.given = newest
        return newest, {}, {"pace": self.pace}

    def behind_s(self):
        return 0.0

    def alive(self):
        return True


class Watch:
    def optimizer_gone(self, *args, **kwargs):
        return None


def drive_loop(pace, seconds: float = 120.0):
    clock, stop = FakeClock(), StopFlag(install_signals=False)
    worker = Worker(clock)
    metrics = SimpleNamespace(**{name: lambda *a: None for name in (
        "env_steps", "agent_steps", "backlog", "episode", "param_version", "params_behind", "pace")})
    uploader = SimpleNamespace(add=lambda segment: None, stats=SimpleNamespace(backlog=0))
    loop = RolloutLoop(worker, uploader, Poller(clock, pace), Watch(), metrics, 2, 0.0, stop,
                       logging.getLogger("test"), clock=clock)
    run = loop.run()
    request = next(run)
    while clock.now < seconds:
        clock.now += request.seconds
        request = run.send(None)
    return worker, loop


def test_a_worker_plays_the_share_of_its_time_its_version_asks_for():
    worker, loop = drive_loop(pace=0.25)
    played_s = 2.0 * len(worker.played)
    assert 0.2 < played_s / 120.0 < 0.3, played_s
    assert loop.paused_s > 0.7 * 120.0
    full, _ = drive_loop(pace=1.0)
    assert len(full.played) >= 55, "at full speed no pause"
    hostile, _ = drive_loop(pace=0.0)  # not a pace a version may ask for: full speed
    assert len(hostile.played) >= 55


def test_after_a_pause_the_next_segment_plays_the_newest_version():
    worker, _ = drive_loop(pace=0.25)
    # a segment started at t - 2 plays the version published by then: at most one version (5 s) behind
    behind = [int((t - 2.0) // 5) - version for t, version in worker.played[2:]]
    assert max(behind) <= 0, behind
