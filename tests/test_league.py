"""League: pool store round trip and concurrency, sampling formulas, ratings, results, CLI."""

from __future__ import annotations

import argparse
import math
import threading

import numpy as np
import pytest

from rapid.errors import FormatError, UsageError
from rapid.formats.params import ParamsObject
from rapid.infra.store import LocalStore
from rapid.league import cli
from rapid.league.pool import League
from rapid.league.ratings import MU, SIGMA, conservative, rate_games, rating_of
from rapid.league.results import Tally, fold_tally
from rapid.league.sampling import (
    LATEST,
    OpponentSampler,
    opponent_distribution,
    pfsp_probabilities,
    pfsp_weight,
    quality_probabilities,
)
from rapid.league.state import (
    Member,
    PoolFormatError,
    PoolMissing,
    PoolState,
    ensure_bots,
    foreign_id,
    version_id,
)
from rapid.run.config import LeagueConfig
from rapid.run.config_files import load_config
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import POOL_POINTER, params_key, pool_revision_key, snapshot_key
from tests.s3_server import s3_server, s3_store  # noqa: F401  (fixtures)


def snap(i: int, q: float = 0.0, **kw) -> Member:
    return Member(id=version_id(i), kind="snapshot", version=i, quality=q, added_at=float(i), **kw)


def pool_of(*members: Member) -> PoolState:
    return PoolState(members={m.id: m for m in members})


def games(*played: tuple[str, str]) -> Tally:
    """A tally of (opponent, winner) games, as a rank counts them from experience episodes."""
    tally = Tally()
    tally.add([{"opponent": opponent, "winner": winner} for opponent, winner in played])
    return tally


def result(opponent: str, winner: str = "learner") -> tuple[str, str]:
    return opponent, winner


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "run")


# --- quality scores and sampling ---------------------------------------------------------------------

def test_quality_update_matches_formula():
    state = pool_of(snap(1, 0.0), snap(2, 0.5), snap(3, 1.0))
    eta = 0.01
    p = math.exp(0.5) / (math.exp(0.0) + math.exp(0.5) + math.exp(1.0))
    after = fold_tally(state, games(result(version_id(2))), eta)
    assert after.members[version_id(2)].quality == pytest.approx(0.5 - eta / (3 * p))
    assert after.members[version_id(2)].wins == 1 and after.members[version_id(2)].games == 1
    assert state.members[version_id(2)].quality == 0.5  # pure: the input is unchanged
    # Losses and draws count but leave the quality alone.
    after = fold_tally(after, games(result(version_id(1), "opponent"), result(version_id(1), "draw"),
                                    result(LATEST)))
    m = after.members[version_id(1)]
    assert (m.games, m.wins, m.losses, m.draws, m.quality) == (2, 0, 1, 1, 0.0)
    assert after.latest_games == 1


def test_snapshot_joins_with_pool_maximum(store):
    league = League(store)
    ParameterStore(store).publish(1, {"w": np.zeros(3, np.float32)})
    ParameterStore(store).publish(2, {"w": np.ones(3, np.float32)})
    assert league.add_snapshot_from_params(1).quality == 0.0  # empty pool: 0
    league.update(lambda s: fold_tally(s, games(*[result(version_id(1))] * 3)))
    league.update(lambda s: ensure_bots(s, ["bot:random"], 0.0))
    q1 = league.read().members[version_id(1)].quality
    assert q1 < 0
    assert league.add_snapshot_from_params(2).quality == pytest.approx(q1)


class FixedPool:
    """Stands in for a League: the sampler only reads the pool."""

    def __init__(self, state: PoolState):
        self.state = state

    def read_or_empty(self) -> PoolState:
        return self.state


def _draw_counts(dist_fn, config, state, n=20_000, seed=0):
    sampler = OpponentSampler(FixedPool(state), config)
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for _ in range(n):
        choice = sampler.choose(rng)
        counts[choice.id] = counts.get(choice.id, 0) + 1
    return counts, dist_fn(state, config)


def _chi_square_ok(counts, dist, n):
    # Chi-square goodness of fit; the 0.999 quantile for up to 6 degrees of freedom is < 23.
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in dist.items() if p > 0)
    return stat < 23 and set(counts) <= {k for k, p in dist.items() if p > 0}


def test_openai_five_distribution_against_formula():
    state = pool_of(snap(1, -1.0), snap(2, 0.0), snap(3, 0.7), snap(4, 2.0, retired=True))
    state = ensure_bots(state, ["bot:random", "bot:lane"], 0.0)
    config = LeagueConfig(latest_prob=0.8, bot_prob=0.1)
    dist = opponent_distribution(state, config)
    z = math.exp(-1.0) + 1 + math.exp(0.7)
    assert dist[LATEST] == pytest.approx(0.9 * 0.8)
    assert dist[version_id(3)] == pytest.approx(0.9 * 0.2 * math.exp(0.7) / z)
    assert dist["bot:lane"] == pytest.approx(0.05)
    assert version_id(4) not in dist  # retired
    assert sum(dist.values()) == pytest.approx(1.0)
    counts, dist = _draw_counts(opponent_distribution, config, state)
    assert _chi_square_ok(counts, dist, 20_000)


def test_missing_categories_fall_back_to_latest():
    assert opponent_distribution(PoolState(), LeagueConfig(bot_prob=0.5)) == {LATEST: 1.0}


def test_pfsp_weighting():
    assert pfsp_weight(0.25, 2.0) == pytest.approx(0.5625)
    assert pfsp_weight(1.0, 2.0) == 0.0
    a = snap(1, games=4, wins=3)  # learner wins 75%
    b = snap(2, games=4, wins=1, draws=2)  # learner scores (1 + 1) / 4 = 50%
    c = snap(3)  # never played: 0.5
    probs = pfsp_probabilities([a, b, c], 2.0)
    w = [0.25 ** 2, 0.5 ** 2, 0.5 ** 2]
    assert [probs[m.id] for m in (a, b, c)] == pytest.approx([x / sum(w) for x in w])
    assert pfsp_probabilities([snap(1, games=2, wins=2)], 1.0) == {version_id(1): 1.0}  # all zero: uniform
    state = pool_of(a, b, c)
    counts, dist = _draw_counts(opponent_distribution, LeagueConfig(scheme="pfsp", latest_prob=0.5),
                                state, seed=1)
    assert _chi_square_ok(counts, dist, 20_000)


def test_quality_probabilities_are_softmax_and_bad_config_rejected():
    probs = quality_probabilities([snap(1, 1000.0), snap(2, 999.0)])  # no overflow
    assert probs[version_id(1)] == pytest.approx(math.e / (math.e + 1))
    # The sampler takes the config's league section, checked once when the config is loaded.
    with pytest.raises(UsageError, match="league.scheme"):
        load_config(None, ["league.scheme=elo"])
    with pytest.raises(UsageError, match="league.latest_prob"):
        load_config(None, ["league.latest_prob=1.5"])


def test_sampler_refresh_and_params_cache(store):
    league = League(store)
    ParameterStore(store).publish(5, {"w": np.full(3, 5, np.float32)})
    clock = [0.0]
    sampler = OpponentSampler(league, LeagueConfig(latest_prob=0.0, refresh_s=10), cache_size=1,
                              clock=lambda: clock[0])
    rng = np.random.default_rng(0)
    assert sampler.choose(rng).kind == "latest"  # no pool yet
    league.add_snapshot_from_params(5)
    assert sampler.choose(rng).kind == "latest"  # not refreshed yet
    clock[0] = 11.0
    choice = sampler.choose(rng)
    assert (choice.id, choice.kind, choice.version) == (version_id(5), "snapshot", 5)
    first = sampler.load_params(choice.id)
    store.delete(snapshot_key(choice.id))  # a cached snapshot is not downloaded again
    assert sampler.load_params(choice.id) is first


# --- the pool in the store ---------------------------------------------------------------------------

def test_snapshot_is_an_immutable_copy(store):
    params = ParameterStore(store)
    live = np.zeros(3, np.float32)
    params.publish(7, {"w": live})
    league = League(store)
    league.add_snapshot_from_params(7)
    league.add_snapshot(ParamsObject(8, {"w": live}), member_id="live8")
    before = {k: store.get(snapshot_key(k)) for k in (version_id(7), "live8")}
    live += 1.0  # the live tensor changes
    store.put(params_key(7), b"overwritten")  # and params/ is rewritten or deleted by retention
    store.delete(params_key(7))
    assert {k: store.get(snapshot_key(k)) for k in before} == before
    assert league.load_snapshot(version_id(7)).tensors["w"].tolist() == [0, 0, 0]


def test_pool_round_trip_through_local_store(store):
    league = League(store)
    with pytest.raises(PoolMissing):
        league.read()
    state = ensure_bots(pool_of(snap(1, 0.25, pinned=True)), ["bot:lane"], 3.0)
    state = rate_games(state, version_id(9), version_id(1), 2, 1, 1, 4.0)
    league.update(lambda s: state)
    again = League(LocalStore(store.root)).read()  # a fresh process sees the same state
    assert again.members == state.members and again.ratings == state.ratings
    assert again.history == state.history and again.revision == 1


def test_concurrent_updates_lose_nothing(store):
    league = League(store, keep_revisions=8)  # small: garbage collection runs during the race
    league.update(lambda s: pool_of(snap(1)))

    def bump(state: PoolState) -> PoolState:
        state.members[version_id(1)].games += 1
        return state

    def worker():
        mine = League(LocalStore(store.root), keep_revisions=8)
        for _ in range(25):
            mine.update(bump)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = league.read()
    assert state.members[version_id(1)].games == 100
    assert state.revision == 101
    assert len(store.list("league/pool/")) <= 8 + 16 + 1


def test_pool_on_s3(s3_store, capsys):
    """The same scheme on S3, where put_if_absent is a conditional PUT (IfNoneMatch)."""
    league = League(s3_store, keep_revisions=4)
    ParameterStore(s3_store).publish(2, {"w": np.zeros(3, np.float32)})
    assert cli.run(parse("add", "--version", "2"), s3_store) == 0

    def bump(state: PoolState) -> PoolState:
        state.members[version_id(2)].games += 1
        return state

    threads = [threading.Thread(target=lambda: [league.update(bump) for _ in range(8)]) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert league.read().members[version_id(2)].games == 24
    capsys.readouterr()
    assert cli.run(parse("ls"), s3_store) == 0
    assert version_id(2) in capsys.readouterr().out


def test_lagging_pointer_and_corrupt_documents(store):
    league = League(store)
    league.update(lambda s: pool_of(snap(1)))
    old_pointer = store.get(POOL_POINTER)
    league.update(lambda s: pool_of(snap(1), snap(2)))
    store.put(POOL_POINTER, old_pointer)  # a slow writer rewrote an older copy
    assert set(league.read().members) == {version_id(1), version_id(2)}
    store.put(POOL_POINTER, b"{not json")  # a damaged pointer is only a cache
    assert league.read().revision == 2
    store.put(pool_revision_key(2), b'{"format": "rapid.league_pool", "schema": 1}')
    with pytest.raises(PoolFormatError):
        league.read()
    for bad in (b"\xff", b"[]", b'{"format": "rapid.league_pool", "schema": 99}'):
        store.put(pool_revision_key(2), bad)
        with pytest.raises(PoolFormatError):
            league.read()
    assert issubclass(PoolFormatError, FormatError)
    with pytest.raises(UsageError, match="damaged"):
        cli.run(parse("ls"), store)


# --- ratings -----------------------------------------------------------------------------------------

def test_trueskill_winner_gains_and_sigma_shrinks():
    state = PoolState()
    mus, sigmas = [], []
    for i in range(5):
        state = rate_games(state, "v000000000001", "bot:random", 3, 0, 0, float(i))
        r = rating_of(state, "v000000000001")
        mus.append(r.mu)
        sigmas.append(r.sigma)
    assert mus[0] > MU and all(a < b for a, b in zip(mus, mus[1:]))
    assert sigmas[0] < SIGMA and all(a > b for a, b in zip(sigmas, sigmas[1:]))
    assert rating_of(state, "bot:random").mu < MU
    assert conservative(rating_of(state, "x")) == pytest.approx(MU - 3 * SIGMA)
    assert rating_of(state, "v000000000001").games == 15 and len(state.history) == 10


# --- match results -----------------------------------------------------------------------------------

def test_tally_round_trip_and_rejects_corrupt():
    tally = games(result(version_id(1)), result(version_id(1), "draw"), result(LATEST, "opponent"))
    data = tally.encode()
    assert Tally.decode(data) == tally and tally.games == 3
    with pytest.raises(FormatError):
        Tally.decode(data[:-3])
    with pytest.raises(FormatError):
        Tally.decode(data[:20] + bytes([data[20] ^ 1]) + data[21:])
    from rapid.formats import codec
    for counts in ({"x": [1, 2]}, {"x": [1, 2, -1]}, {"x": [True, 0, 0]}, {"": [1, 0, 0]}, {"x" * 200: [1, 0, 0]},
                   {"x": "1,0,0"}, {"x": [1.5, 0, 0]}):
        with pytest.raises(FormatError):
            Tally.decode(codec.encode("rapid.match_tally", 1, {"counts": counts}))


def test_pooled_tallies_fold_like_the_games_one_by_one():
    """Ranks' tallies summed and folded at once move each quality exactly as folding every game separately
    with the sampling probabilities of before the fold (OpenAI Five's p_i is the one the games were played at)."""
    state = pool_of(snap(1, 0.0), snap(2, 0.5), Member(id="bot:lane", kind="bot", version=None))
    rank0 = games(result(version_id(1)), result(version_id(2)), result(LATEST, "draw"))
    rank1 = games(result(version_id(1)), result(version_id(1), "opponent"), result("bot:lane"), result("gone"))
    pooled = Tally.merge([Tally.decode(rank0.encode()), Tally.decode(rank1.encode())])
    after = fold_tally(state, pooled, eta=0.01)
    p = quality_probabilities(state.snapshots())
    assert after.members[version_id(1)].quality == pytest.approx(0.0 - 2 * 0.01 / (2 * p[version_id(1)]))
    assert after.members[version_id(2)].quality == pytest.approx(0.5 - 0.01 / (2 * p[version_id(2)]))
    m = after.members[version_id(1)]
    assert (m.games, m.wins, m.losses) == (3, 2, 1)
    assert after.members["bot:lane"].wins == 1 and after.latest_games == 1 and "gone" not in after.members


# --- CLI ---------------------------------------------------------------------------------------------

def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rapid")
    cli.build_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["league", *argv])


def test_cli_commands(store, tmp_path, capsys):
    with pytest.raises(UsageError, match="no league pool"):
        cli.run(parse("ls"), store)
    params = ParameterStore(store)
    params.publish(3, {"w": np.zeros(3, np.float32)})
    params.publish(4, {"w": np.ones(3, np.float32)})
    assert cli.run(parse("add", "--version", "3"), store) == 0
    assert cli.run(parse("add", "--version", "4", "--pin"), store) == 0
    assert cli.run(parse("add", "--bot", "random"), store) == 0
    (tmp_path / "p.rpm").write_bytes(store.get(params_key(4)))
    assert cli.run(parse("add", "--file", str(tmp_path / "p.rpm"), "--id", "other4"), store) == 0
    with pytest.raises(UsageError, match="not in"):
        cli.run(parse("add", "--version", "99"), store)
    (tmp_path / "bad.rpm").write_bytes(b"nope")
    with pytest.raises(UsageError, match="not a valid"):
        cli.run(parse("add", "--file", str(tmp_path / "bad.rpm")), store)
    with pytest.raises(UsageError, match="pinned"):
        cli.run(parse("retire", "4"), store)
    assert cli.run(parse("unpin", "4"), store) == 0
    assert cli.run(parse("pin", "bot:random"), store) == 0
    assert cli.run(parse("retire", "v000000000003"), store) == 0
    with pytest.raises(UsageError, match="unknown league member"):
        cli.run(parse("pin", "nobody"), store)
    capsys.readouterr()
    assert cli.run(parse("ls"), store) == 0
    out = capsys.readouterr().out
    assert "v000000000004" in out and "bot:random" in out and "v000000000003" not in out
    assert "25.0 ± 8.3" in out
    cli.run(parse("ls", "--all"), store)
    assert "v000000000003 (retired)" in capsys.readouterr().out
    state = League(store).read()
    assert state.members["bot:random"].pinned and not state.members[version_id(4)].pinned

    def play_match(a, b, games):
        return games, 0, 0

    assert cli.run(parse("rate", "--games", "3"), store, play_match=play_match) == 0
    assert rating_of(League(store).read(), version_id(4)).mu > MU
    assert cli.run(parse("plot", "--out", str(tmp_path / "r.png")), store) == 0
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"

    export = tmp_path / "pool.rlx"
    assert cli.run(parse("export", str(export)), store) == 0
    other = LocalStore(tmp_path / "other")
    assert cli.run(parse("import", str(export)), other) == 0
    imported = League(other).read()
    # v… ids name the importing run's own learner versions: another run's are renamed, with their ratings.
    v4 = foreign_id(version_id(4), store.get(snapshot_key(version_id(4))))
    assert set(imported.members) == {"bot:random", "other4", v4,
                                     foreign_id(version_id(3), store.get(snapshot_key(version_id(3))))}
    assert imported.ratings[v4] == League(store).read().ratings[version_id(4)]
    assert League(other).load_snapshot("other4").tensors["w"].tolist() == [1, 1, 1]
    assert cli.run(parse("import", str(export)), other) == 0  # idempotent: all skipped
    assert "skipped 4" in capsys.readouterr().out
    (tmp_path / "bad.rlx").write_bytes(export.read_bytes()[:100])
    with pytest.raises(UsageError, match="not a valid league export"):
        cli.run(parse("import", str(tmp_path / "bad.rlx")), other)
    with pytest.raises(UsageError):
        cli.run(parse("rate"), store)  # no evaluation code wired
