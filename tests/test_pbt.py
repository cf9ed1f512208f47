"""Population-based training (docs/pbt.md): the round's decision, the members' agreement on it through the store,
an exploit torn by a crash at every write, and fitness that only counts once it rates the copy."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
import torch

from rapid.formats.checkpoint import Checkpoint
from rapid.infra.store import LocalStore, StoreError
from rapid.league import League
from rapid.league.population import Fitness, Population, decide, explore
from rapid.opt.model import Policy
from rapid.optimizer.checkpoints import load_latest_checkpoint, resume_point, save_checkpoint
from rapid.roles.pbt_member import EXPLOIT, MemberState, PbtWatch, apply_exploit
from rapid.roles.restarts import EXPLOITED, RestartPolicy
from rapid.roles.startup import StopFlag
from rapid.run.config import Config
from rapid.run.config_files import load_config
from rapid.run.population import PopulationStore
from rapid.run.store_map import pbt_applied_key, pbt_round_key

LOG = logging.getLogger("test-pbt")
SEARCH = {"lr": (1e-4, 1e-2), "entropy_coef": (1e-3, 1e-1)}


def population(members: int = 4, start: float = 0.0) -> Population:
    return Population(members, start, 60.0, dict(SEARCH), [{"lr": 1e-3 * (m + 1), "entropy_coef": 0.01}
                                                           for m in range(members)])


def stores(tmp_path, members: int = 4) -> PopulationStore:
    return PopulationStore(LocalStore(tmp_path / "root"), lambda m: LocalStore(tmp_path / "root" / "members" / f"m{m}"),
                           LOG)


def test_the_worst_copies_the_best_by_a_margin_and_explores_inside_the_ranges():
    pop = population(4)
    fit = {0: Fitness(1, 100.0, 10.0), 1: Fitness(1, 500.0, 10.0), 2: Fitness(1, 300.0, 10.0),
           3: Fitness(1, 90.0, 10.0)}
    for seed in range(20):
        r = decide(pop, 1, 60.0, fit, [dict(h) for h in pop.initial], {1: 5, 2: 4}, perturb=1.25,
                   exploit_fraction=0.25, min_gap_sigma=1.0, rng=np.random.default_rng(seed))
        assert [(m.member, m.leader, m.checkpoint) for m in r.moves] == [(3, 1, 5)]
        for k, (lo, hi) in SEARCH.items():
            assert lo <= r.hparams[3][k] <= hi
            assert r.hparams[3][k] == pytest.approx(min(max(pop.initial[1][k] * 1.25, lo), hi)) or \
                r.hparams[3][k] == pytest.approx(min(max(pop.initial[1][k] / 1.25, lo), hi))
        assert r.hparams[:3] == pop.initial[:3]  # only the member that copied changes


def test_no_copy_within_the_noise_of_the_ratings_or_without_two_rated_members():
    pop, rng = population(2), np.random.default_rng(0)
    close = {0: Fitness(1, 100.0, 40.0), 1: Fitness(1, 150.0, 40.0)}  # 50 apart, sd of the difference 56.6
    kw = dict(perturb=1.25, exploit_fraction=0.5, rng=rng)
    assert decide(pop, 1, 0.0, close, pop.initial, {0: 1, 1: 1}, min_gap_sigma=1.0, **kw).moves == []
    assert len(decide(pop, 1, 0.0, close, pop.initial, {0: 1, 1: 1}, min_gap_sigma=0.5, **kw).moves) == 1
    assert decide(pop, 1, 0.0, {0: close[0], 1: None}, pop.initial, {0: 1, 1: 1}, min_gap_sigma=0, **kw).moves == []
    # a leader without a checkpoint has nothing to give
    assert decide(pop, 1, 0.0, close, pop.initial, {0: 1}, min_gap_sigma=0.0, **kw).moves == []


def test_explore_clips_to_the_range():
    out = explore({"lr": 1e-2, "entropy_coef": 1e-3}, SEARCH, 4.0, np.random.default_rng(1))
    assert 1e-4 <= out["lr"] <= 1e-2 and 1e-3 <= out["entropy_coef"] <= 1e-1


def _policy(seed: int) -> tuple[Policy, torch.optim.Adam]:
    torch.manual_seed(seed)
    policy = Policy(obs_dim=4, action_heads=(3,), hidden=8)
    adam = torch.optim.Adam(policy.parameters())
    for p in policy.parameters():  # one step, so Adam has moments to copy
        p.grad = torch.randn_like(p)
    adam.step()
    return policy, adam


def _checkpoint(store, version: int, seed: int, meta=None) -> Checkpoint:
    policy, adam = _policy(seed)
    ckpt = Checkpoint.from_torch(version, 10 * version, policy.tensors(), adam.state_dict(), meta)
    save_checkpoint(store, ckpt, keep=3)
    return ckpt


def _members_with_a_decided_loss(tmp_path) -> tuple[PopulationStore, Population, Checkpoint, Checkpoint]:
    pops = stores(tmp_path, 2)
    pop = pops.ensure(population(2))
    leader = _checkpoint(pops.member_store(0), 7, seed=1)
    own = _checkpoint(pops.member_store(1), 9, seed=2, meta=MemberState(0, dict(pop.initial[1])).meta())
    fit = {0: Fitness(7, 400.0, 10.0), 1: Fitness(9, 100.0, 10.0)}
    r = decide(pop, 1, 60.0, fit, [dict(h) for h in pop.initial], {0: 7, 1: 9}, perturb=1.25, exploit_fraction=0.5,
               min_gap_sigma=1.0, rng=np.random.default_rng(0))
    assert pops.propose(pop, r) is not None and [m.member for m in r.moves] == [1]
    return pops, pop, leader, own


class CrashAfter(LocalStore):
    """Dies (a StoreError, as a killed process stops writing) at its ``n``-th write."""

    def __init__(self, root, n: int):
        super().__init__(root)
        self.left = n

    def _write(self):
        self.left -= 1
        if self.left < 0:
            raise StoreError("killed")

    def put(self, key, data):
        self._write()
        super().put(key, data)

    def put_if_absent(self, key, data):
        self._write()
        return super().put_if_absent(key, data)

    def delete(self, key):
        self._write()
        super().delete(key)


def _state(store, pop) -> tuple[dict, MemberState, dict]:
    """What the member would start from: the weights, state and Adam moments a resume loads."""
    policy, adam = _policy(99)
    point = resume_point(store, policy, adam, LOG)
    return policy.tensors(), MemberState.of(point.meta, pop, 1), adam.state_dict()["state"]


@pytest.mark.parametrize("crash_at", range(4))
def test_an_exploit_torn_at_any_write_leaves_the_member_wholly_itself_or_wholly_the_copy(tmp_path, crash_at):
    pops, pop, leader, own = _members_with_a_decided_loss(tmp_path)
    stored = pops.read_round(pop, 1)
    member_dir = tmp_path / "root" / "members" / "m1"
    torn = PopulationStore(CrashAfter(tmp_path / "root", crash_at), pops.member_store, LOG)
    try:
        apply_exploit(torn, pop, 1, CrashAfter(member_dir, crash_at), keep=3, log=LOG)
    except StoreError:
        pass
    tensors, state, moments = _state(pops.member_store(1), pop)
    whole_copy = all(np.array_equal(tensors[k], leader.model[k]) for k in leader.model)
    whole_self = all(np.array_equal(tensors[k], own.model[k]) for k in own.model)
    assert whole_copy != whole_self
    assert state.hparams == (stored.hparams[1] if whole_copy else pop.initial[1])
    assert state.round == (1 if whole_copy else 0)
    # the restart finishes it: the copy, its hyperparameters, the leader's Adam moments, and the record
    version = apply_exploit(pops, pop, 1, pops.member_store(1), keep=3, log=LOG)
    tensors, state, moments = _state(pops.member_store(1), pop)
    assert all(np.array_equal(tensors[k], leader.model[k]) for k in leader.model)
    assert state.hparams == stored.hparams[1] and state.lineage == [[1, 0, 7]]
    assert np.array_equal(moments[0]["exp_avg"].numpy(), leader.adam["state"][0]["exp_avg"])
    record = pops.applied(1, 1)
    assert record is not None and record["version"] == load_latest_checkpoint(pops.member_store(1)).version
    assert version is None or version == record["version"]
    assert apply_exploit(pops, pop, 1, pops.member_store(1), keep=3, log=LOG) is None  # done once only


def test_members_agree_on_one_decision_and_only_the_loser_stops(tmp_path):
    pops = stores(tmp_path, 2)
    pop = pops.ensure(population(2))
    for m in range(2):
        _checkpoint(pops.member_store(m), 3, seed=m)
    pops.write_fitness(0, Fitness(3, 400.0, 10.0))
    pops.write_fitness(1, Fitness(3, 100.0, 10.0))
    cfg = load_config(None, ["pbt.members=2", "pbt.min_gap_sigma=1", "pbt.exploit_fraction=0.5",
                             "eval.ladder={random=0.0}", "league.snapshot_every=0"])
    flags = [StopFlag(install_signals=False) for _ in range(2)]
    watches = []
    for m in range(2):
        member_cfg = load_config(None, ["pbt.members=2", f"pbt.member={m}", "pbt.exploit_fraction=0.5",
                                        "eval.ladder={random=0.0}", "league.snapshot_every=0", f"run.seed={m}"])
        watches.append(PbtWatch(pops, pop, MemberState(0, dict(pop.initial[m])), member_cfg,
                                League(pops.member_store(m)), flags[m], LOG, clock=lambda: 61.0))  # r1 is due
    assert cfg.pbt.members == 2
    threads = [threading.Thread(target=w.tick) for w in watches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rounds = pops.rounds(pop)
    assert [r.round for r in rounds] == [1] and [(m.member, m.leader) for m in rounds[0].moves] == [(1, 0)]
    assert (tmp_path / "root" / pbt_round_key(1)).is_file()
    assert flags[1].reason == EXPLOIT and not flags[0]
    # the first proposal stands: a later one (other random draws) gets the stored one back
    fit = pops.usable_fitness(pop, [])
    a, b = (decide(pop, 2, 121.0, fit, pop.initial, {0: 3, 1: 3}, perturb=1.25, exploit_fraction=0.5,
                   min_gap_sigma=1.0, rng=np.random.default_rng(seed)) for seed in (1, 2))
    assert a.hparams[1] != b.hparams[1]
    assert pops.propose(pop, a).hparams == a.hparams and pops.propose(pop, b).hparams == a.hparams


def test_a_rating_counts_only_once_it_rates_the_copy(tmp_path):
    pops, pop, leader, own = _members_with_a_decided_loss(tmp_path)
    pops.write_fitness(1, Fitness(9, 100.0, 10.0))
    rounds = pops.rounds(pop)
    assert pops.usable_fitness(pop, rounds)[1] is None  # decided, not applied
    version = apply_exploit(pops, pop, 1, pops.member_store(1), keep=3, log=LOG)
    assert version == 10 and (tmp_path / "root" / pbt_applied_key(1, 1)).is_file()
    assert pops.usable_fitness(pop, rounds)[1] is None  # the rating is of the member before its copy
    pops.write_fitness(1, Fitness(11, 420.0, 10.0))
    assert pops.usable_fitness(pop, rounds)[1] == Fitness(11, 420.0, 10.0)


def test_a_corrupt_round_is_skipped_and_a_stored_population_of_another_size_is_refused(tmp_path):
    pops = stores(tmp_path, 2)
    pop = pops.ensure(population(2))
    (tmp_path / "root" / "pbt" / "rounds").mkdir(parents=True)
    (tmp_path / "root" / pbt_round_key(1)).write_text('{"format": "rapid.pbt_round", "round": 1, "moves": 7}')
    assert pops.rounds(pop) == []
    from rapid.errors import FormatError

    with pytest.raises(FormatError, match="2 members"):
        pops.ensure(population(3))


def test_an_exploited_member_is_started_again_at_once_and_not_counted_as_a_failure():
    policy = RestartPolicy(max_restarts=0)
    policy.started(0.0)
    verdict = policy.after_exit(EXPLOITED, 1.0)
    assert verdict.restart and verdict.delay_s == 0 and not verdict.failure


def test_config_checks_the_population_and_a_member_lives_under_it():
    cfg = load_config("configs/default.toml", ["pbt.members=3", "pbt.member=2", 'store.url="s3://b/exp"'])
    derived = cfg.derive()
    assert derived.store_url == "s3://b/exp/members/m2" and derived.population_url == "s3://b/exp"
    assert derived.run_dir.endswith("/members/m2")
    from rapid.errors import UsageError

    with pytest.raises(UsageError) as e:
        load_config(None, ["pbt.members=2", "pbt.search.gae_lambda=[0.9, 0.99]", "pbt.perturb=1.0"])
    assert "gae_lambda" in str(e.value) and "pbt.perturb" in str(e.value) and "eval.ladder" in str(e.value)
    assert Config().pbt.members == 0


def test_a_population_trains_plays_each_other_and_copies_through_the_store(tmp_path):
    """`rapid train --pbt 2` for real: rounds every 30 s, a copy made and taken up by a restarted member, members'
    versions in each other's pools, and `rapid pbt ls` showing the lineage."""
    from tests.helpers import rapid

    run = tmp_path / "pop"
    out = rapid("train", "--config", "configs/default.toml", "--pbt", "2", "--run-dir", str(run), "--minutes", "1.7",
                "--workers", "2", "--set", "pbt.interval_s=30", "--set", "pbt.min_gap_sigma=0",
                "--set", "eval.ladder_interval_s=8", "--set", "eval.ladder_games=10", "--set", "eval.interval_s=8",
                "--set", "eval.games=20", "--set", "league.snapshot_every=5", "--no-progress", timeout=400)
    assert "m0 exit 0, m1 exit 0" in out.stdout, out.stdout
    pops = PopulationStore(LocalStore(run / "store"), lambda m: LocalStore(run / "store" / "members" / f"m{m}"), LOG)
    pop = pops.population()
    rounds = pops.rounds(pop)
    moves = [(r.round, m) for r in rounds for m in r.moves]
    assert len(rounds) >= 2 and moves, out.stdout
    r, move = moves[0]
    record = pops.applied(r, move.member)
    assert record is not None and record["leader"] == move.leader
    # the member restarted from the copy: its newest checkpoint carries a copied state and that round's settings
    state = MemberState.of(load_latest_checkpoint(pops.member_store(move.member)).meta, pop, move.member)
    assert state.round >= r and state.lineage
    assert state.hparams == next(x for x in rounds if x.round == state.round).hparams[move.member]
    for m in range(2):
        pool = League(pops.member_store(m)).read()
        assert any(i.startswith(f"m{1 - m}-v") for i in pool.members), sorted(pool.members)
    listing = rapid("pbt", "ls", "--run-dir", str(run)).stdout
    assert f"r{r}←m{move.leader}" in listing and "rating" in listing
    assert (run / "report" / "pbt.png").is_file()
