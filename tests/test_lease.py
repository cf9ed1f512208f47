"""Issue 12: two optimizers on one run. The run lease on the local store and on S3 (moto_server), and the real
`rapid optimizer` refusing to start beside a live one with one line, exit 2, writing nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

import pytest

from rapid.errors import UsageError
from rapid.infra.store import LocalStore
from rapid.roles.startup import StopFlag
from rapid.run.config_files import load_config, to_toml
from rapid.run.lease import LeaseHeld, RunLease
from rapid.run.store_map import LEASE_PREFIX, lease_key
from tests.helpers import RAPID, ROOT, wait_for
from tests.s3_server import DUMMY_CREDENTIALS, s3_server, s3_store  # noqa: F401  (fixtures)

SMALL = ["env.num_games=8", "model.hidden=16", "model.lstm=16", "model.encoder_layers=1", "rollout.bptt=8",
         "optimizer.batch_samples=32", "optimizer.buffer_samples=256", "optimizer.poll_s=0.2",
         "eval.interval_s=0", "league.snapshot_every=0"]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    return request.getfixturevalue("s3_store") if request.param == "s3" else LocalStore(tmp_path / "run")


def test_second_holder_refused_until_expiry_or_release(store):
    clock = Clock()
    a = RunLease(store, ttl_s=60, clock=clock, host="host-a", pid=101).acquire()
    b = RunLease(store, ttl_s=60, clock=clock, host="host-b", pid=202)
    with pytest.raises(LeaseHeld, match="host-a pid 101") as caught:
        b.acquire()
    assert isinstance(caught.value, UsageError) and "\n" not in str(caught.value)
    clock.now += 30
    assert a.renew() and a.held  # renewed: good for another 60 s
    clock.now += 45
    with pytest.raises(LeaseHeld):
        b.acquire()
    clock.now += 61  # a stopped renewing (its host died): b takes over, a finds out at its next renewal
    b.acquire()
    assert b.held and not a.renew() and a.lost and not a.held
    b.release()
    RunLease(store, clock=clock, host="host-c", pid=303).acquire()  # released: no wait
    assert len(store.list(LEASE_PREFIX)) <= 5, "old epochs are collected"


def test_only_one_of_racing_optimizers_wins(store):
    won, lost = [], []
    barrier = threading.Barrier(6)

    def contender(i: int) -> None:
        lease = RunLease(store, host=f"host-{i}", pid=1000 + i)
        barrier.wait()
        try:
            lease.acquire()
            won.append(i)
        except LeaseHeld:
            lost.append(i)

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(won) == 1 and len(lost) == 5


def test_dead_process_on_this_host_and_bad_documents_do_not_lock_the_run(tmp_path):
    store = LocalStore(tmp_path / "run")
    gone = subprocess.Popen(["true"])
    gone.wait()
    RunLease(store, pid=gone.pid).acquire()  # this host, a process that has exited
    RunLease(store).acquire()
    for bad in (b"garbage", b'{"owner": "x", "host": "h", "pid": 1, "expires": 1e999}', b"[]"):
        store.put(lease_key(100), bad)
        lease = RunLease(store, host="elsewhere", pid=7).acquire()
        assert lease.epoch == 101
        store.delete(lease_key(101))


def test_holder_that_loses_the_lease_stops(tmp_path):
    store = LocalStore(tmp_path / "run")
    a = RunLease(store, ttl_s=0.4, host="host-a", pid=1)
    a.acquire()
    stop = StopFlag(install_signals=False)
    a.keep(stop)
    wait_for(lambda: a.epoch >= 3, 30, "two renewals", interval=0.05)
    assert not stop
    store.put_if_absent(lease_key(a.epoch + 1), json.dumps(
        {"owner": "b", "host": "host-b", "pid": 2, "expires": 1e12}).encode())  # b took it over
    wait_for(lambda: bool(stop), 30, "the holder to notice", interval=0.05)
    assert stop.reason == "lease lost" and not a.held
    a.release()


# --- real processes ------------------------------------------------------------------------------------

def optimizer_args(tmp_path, *extra: str) -> list[str]:
    cfg = load_config(None, [*SMALL, f'run.dir="{tmp_path / "run"}"', *extra])
    path = tmp_path / "run.toml"
    path.write_text(to_toml(cfg))
    return [RAPID, "optimizer", "--config", str(path)]


def listing(store) -> dict[str, bytes]:
    return {k: store.get(k) for k in store.list("") if not k.startswith(LEASE_PREFIX)}


def test_second_real_optimizer_refused_one_line_exit_2_nothing_written(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = optimizer_args(tmp_path)
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "first.log", "w"), cwd=ROOT,
                             env=env, start_new_session=True)
    store = LocalStore(tmp_path / "run" / "store")
    try:
        wait_for(lambda: "params/LATEST" in store.list("params/") or first.poll() is not None, 120, "version 0")
        before = listing(store)
        out = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
        assert out.returncode == 2, out.stderr
        errors = [line for line in out.stderr.splitlines() if " INFO " not in line]
        assert len(errors) == 1 and "another optimizer holds this run" in errors[0], out.stderr
        assert "Traceback" not in out.stderr
        assert listing(store) == before, "the refused optimizer wrote nothing"
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0
    assert "final checkpoint written" in (tmp_path / "first.log").read_text()
    # Stopped cleanly, the lease is released: the next optimizer starts at once.
    second = subprocess.Popen([*args, "--resume"], stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / "second.log", "w"), cwd=ROOT, env=env, start_new_session=True)
    try:
        wait_for(lambda: "resumed from checkpoint v0" in (tmp_path / "second.log").read_text()
                 or second.poll() is not None, 120, "the resume")
        assert second.poll() is None, (tmp_path / "second.log").read_text()
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(60)


def test_real_optimizer_refused_on_s3_while_another_holds_the_lease(tmp_path, s3_server, s3_store):
    url = f"s3://{s3_store.bucket}/{s3_store.prefix}"
    RunLease(s3_store, host="another-host", pid=4242).acquire()
    before = listing(s3_store)
    args = optimizer_args(tmp_path, f'store.url="{url}"', f'store.endpoint_url="{s3_server}"',
                          "metrics.enabled=false")
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1", **DUMMY_CREDENTIALS))
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if " INFO " not in line]
    assert len(errors) == 1 and "another-host pid 4242" in errors[0], out.stderr
    assert listing(s3_store) == before


def test_optimizer_that_cannot_start_leaves_no_lease(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = optimizer_args(tmp_path, "metrics.enabled=false")
    store = LocalStore(tmp_path / "run" / "store")
    out = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert out.returncode == 2 and "no usable checkpoint" in out.stderr, out.stderr
    assert store.list("") == [], "a failed resume writes nothing, not even a lease"
    store.put("params/000000000000.rpm", b"x")  # a run already started: a fresh start is refused
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert out.returncode == 2 and "already holds published parameters" in out.stderr, out.stderr
    assert store.list("") == ["params/000000000000.rpm"]
