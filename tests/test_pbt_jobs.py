"""A population as a cluster runs it (docs/pbt.md, "On a cluster"): each member's optimizer, rollout worker and
evaluator are separate jobs against one S3-compatible store, the optimizer under `rapid retry`; nothing but the
store joins them."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from rapid.infra.s3 import S3Store
from rapid.league import League
from rapid.optimizer.checkpoints import load_latest_checkpoint
from rapid.roles.pbt_member import MemberState
from rapid.run.population import PopulationStore
from tests.helpers import RAPID, ROOT
from tests.s3_server import DUMMY_CREDENTIALS

BIN = os.path.dirname(RAPID)


def test_members_as_separate_jobs_decide_and_copy_through_the_store_alone(s3_store, s3_server, tmp_path):
    env = {**os.environ, **DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": s3_server}
    url = s3_store.url
    common = ["--config", "configs/default.toml", "--set", f'store.url="{url}"',
              "--set", f'run.dir="{tmp_path / "run"}"',
              "--set", "pbt.members=2", "--set", "pbt.interval_s=25", "--set", "pbt.min_gap_sigma=0",
              "--set", "eval.ladder_interval_s=8", "--set", "eval.ladder_games=10", "--set", "eval.interval_s=8",
              "--set", "eval.games=20", "--set", "league.snapshot_every=5", "--set", "metrics.enabled=false",
              "--set", "optimizer.decode_workers=0", "--set", "rollout.linger_s=5",
              "--set", "ppo.warmup_updates=0", "--set", "league.warmup_bots=[]"]
    jobs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def job(name: str, *argv: str) -> subprocess.Popen:
        proc = subprocess.Popen(list(argv), stdout=open(logs / f"{name}.log", "w"), stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, start_new_session=True)
        jobs.append(proc)
        return proc

    optimizers = []
    try:
        for m in range(2):
            member = ["--set", f"pbt.member={m}"]
            optimizers.append(job(f"optimizer-{m}", RAPID, "retry", "--", f"{BIN}/rapid-optimizer", *common, *member,
                                  "--set", "run.updates=250", "--resume", "auto"))
            job(f"rollout-{m}", f"{BIN}/rapid-rollout", *common, *member, "--worker-id", f"w{m}")
            job(f"evaluator-{m}", RAPID, "evaluator", *common, *member)
        for proc in optimizers:
            assert proc.wait(timeout=300) == 0, (logs / "optimizer-0.log").read_text()[-3000:]
    finally:
        for proc in jobs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in jobs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def member_store(m: int) -> S3Store:
        return S3Store(f"{url}/members/m{m}", endpoint_url=s3_server)

    pops = PopulationStore(S3Store(url, endpoint_url=s3_server), member_store)
    pop = pops.population()
    rounds = pops.rounds(pop)
    moves = [(r.round, mv) for r in rounds for mv in r.moves]
    assert len(rounds) >= 2 and moves, [r.fitness for r in rounds]
    r, move = moves[0]
    assert pops.applied(r, move.member) is not None
    retry_log = (logs / f"optimizer-{move.member}.log").read_text()
    assert "copy a better member" in retry_log  # rapid retry started the member again at once
    state = MemberState.of(load_latest_checkpoint(member_store(move.member)).meta, pop, move.member)
    assert state.round >= r and state.lineage
    for m in range(2):
        assert any(i.startswith(f"m{1 - m}-v") for i in League(member_store(m)).read().members)
    listing = subprocess.run([RAPID, "pbt", "ls", "--store", url], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=60)
    assert listing.returncode == 0 and f"r{r}←m{move.leader}" in listing.stdout, listing.stdout + listing.stderr
    assert time.time() > pop.start + 2 * pop.interval_s
