"""The data plane at scale (issue 23), unit by unit on a real local store: sharded keys listed from a cursor,
the full listing that finds what the cursor missed, the listing cadence, object splitting and the byte-bounded
upload backlog, the run's layout document, and games pooled across ranks without a per-game object."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rapid.errors import FormatError
from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience
from rapid.infra.store import LocalStore
from rapid.league import League, Tally
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer.loader import ExperienceLoader
from rapid.roles.league_keeper import LeagueKeeper
from rapid.rollout.uploader import Uploader
from rapid.rollout.worker import Segment
from rapid.run.config import Config
from rapid.run.store_map import (
    LAYOUT,
    experience_key,
    owned_shards,
    parse_experience_shard,
    read_layout,
    shard_of,
    write_layout,
)

SHAPE = Shape(bptt=2, obs_dim=3, mask_dim=2, heads=1, lstm=2)
GAME = {"learner_version": 0, "opponent": "latest", "learner_side": 0, "winner": "learner", "length": 9,
        "learner_return": 1.0}


def arrays(samples: int) -> dict[str, np.ndarray]:
    out = {name: np.zeros((samples, *dims), dtype) for name, (dtype, dims) in SHAPE.fields().items()}
    out["mask"][:] = True
    return out


def put(store, shard: int, at_s: float, seq: int, episodes=()) -> str:
    key = experience_key(shard, at_s * 1000, "w0", "inc", seq)
    store.put(key, encode_experience(ExperienceBatch("w0", seq, at_s, arrays(1), ["latest"], list(episodes))))
    return key


class CountingStore(LocalStore):
    """Counts listings and the keys they return (a narrow wrapper: the real store answers)."""

    def __init__(self, root):
        super().__init__(root)
        self.lists, self.listed = 0, 0

    def list(self, prefix="", start_after=None):
        keys = super().list(prefix, start_after)
        self.lists += 1
        self.listed += len(keys)
        return keys


def loader_on(store, **kw) -> ExperienceLoader:
    settings = {"retention_s": 0, "lookback_s": 60.0, "sweep_s": 3600.0, "poll_s": 0.5, **kw}
    return ExperienceLoader(store, SHAPE, ExperienceBuffer(1000, 10**9), **settings)


def test_a_rank_lists_only_its_own_shards_and_only_new_keys(tmp_path):
    store = CountingStore(tmp_path)
    now = time.time()
    old = [put(store, shard, now - 600 - i, i) for i, shard in enumerate([0, 1, 2, 3] * 25)]  # consumed long ago
    loader = loader_on(store, rank=1, world=2, shards=4)
    assert loader.shards == [1, 3] == owned_shards(1, 2, 4)
    assert loader.poll_once() == 50  # the first poll lists everything of its shards: what waited for it
    store.lists = store.listed = 0
    fresh = [put(store, shard, time.time(), 100 + i) for i, shard in enumerate([0, 1, 2, 3])]
    assert loader.poll_once() == 2
    # One listing per owned shard, and the listing returned only keys named within the lookback.
    assert store.lists == 2 and store.listed == 2
    mine = {k for k in old + fresh if parse_experience_shard(k) in (1, 3)}
    assert loader.stats.objects == len(mine) == 52


@pytest.mark.parametrize("world,shards", [(1, 1), (2, 4), (4, 2), (3, 1), (5, 2)])
def test_every_object_has_exactly_one_loader_whatever_the_rank_count(tmp_path, world, shards):
    """A resume on another rank count than the run's shards: ranks split shards (or share one) without
    overlap or gap."""
    store = LocalStore(tmp_path)
    keys = [put(store, shard_of(f"w0-inc-{i}", shards), time.time(), i) for i in range(60)]
    loaders = [loader_on(store, rank=r, world=world, shards=shards) for r in range(world)]
    assert sum(loader.poll_once() for loader in loaders) == len(keys)
    assert all(loader.stats.objects > 0 for loader in loaders)
    assert all(len(loader.shards) <= max(1, -(-shards // world)) for loader in loaders)


def test_the_full_listing_finds_an_object_named_before_the_cursor(tmp_path):
    """A worker whose clock runs far behind (or whose upload took longer than the lookback) names an object
    the cursor has passed: the periodic full listing loads it, counted, and nothing is loaded twice."""
    store = LocalStore(tmp_path)
    loader = loader_on(store, sweep_s=3600.0)
    assert loader.poll_once() == 0
    put(store, 0, time.time() - 300, 1)  # 300 s behind: before the 60 s lookback
    assert loader.poll_once() == 0
    loader._next_sweep = 0.0  # the sweep is due
    assert loader.poll_once() == 1 and loader.stats.swept == 1
    loader._next_sweep = 0.0
    assert loader.poll_once() == 0 and loader.stats.objects == 1


def test_the_wait_between_listings_follows_the_arrivals(tmp_path):
    store = LocalStore(tmp_path)
    clock = [1000.0]
    loader = loader_on(store, poll_s=0.5, poll_max_s=8.0, clock=lambda: clock[0])
    assert loader.next_wait() == 0.5  # a new rank looks often until its listings show otherwise
    for _ in range(30):  # nothing arrives: the wait grows to the longest
        clock[0] += loader.next_wait()
        loader.poll_once()
    assert loader.next_wait() == 8.0
    for i in range(40):  # one object every 2 s
        clock[0] += 2.0
        put(store, 0, time.time(), i)
        loader.poll_once()
    assert 1.5 < loader.next_wait() < 2.5
    for i in range(40):  # ten objects a second
        clock[0] += 1.0
        for j in range(10):
            put(store, 0, time.time(), 1000 + 10 * i + j)
        loader.poll_once()
    assert loader.next_wait() == 0.5


def test_uploads_are_split_below_the_readers_limits_and_keep_their_games(tmp_path):
    store = LocalStore(tmp_path)
    up = Uploader(store, "w0", interval_s=3600, max_backlog=8, shards=4, max_object_samples=3)
    up.add(Segment(arrays(7), opponents=["latest"], episodes=[GAME, GAME], env_steps=70))
    up.flush()
    keys = store.list("experience/")
    batches = [decode_experience(store.get(k), SHAPE) for k in keys]
    assert sorted(b.num_samples for b in batches) == [1, 3, 3] and up.stats.objects == 3
    assert sum(len(b.episodes) for b in batches) == 2 and sum(b.env_steps for b in batches) == 70
    assert {parse_experience_shard(k) for k in keys} <= {0, 1, 2, 3}


def test_the_upload_backlog_is_bounded_in_bytes(tmp_path, caplog):
    class Down(LocalStore):
        def put(self, key, data):
            from rapid.infra.store import StoreError

            raise StoreError("down")

    up = Uploader(Down(tmp_path), "w0", interval_s=3600, max_backlog=100, max_backlog_bytes=1)
    for _ in range(3):
        up.add(Segment(arrays(4), opponents=["latest"]))
        up.flush()
    assert len(up._backlog) == 1 and up.stats.dropped_objects == 2 and up.stats.dropped_samples == 8
    assert up.stats.backlog_bytes == len(up._backlog[0].data)


def test_a_key_is_named_once_even_when_its_upload_is_retried(tmp_path):
    class Flaky(LocalStore):
        fails = 1

        def put(self, key, data):
            from rapid.infra.store import StoreError

            if self.fails:
                self.fails -= 1
                raise StoreError("answer lost")
            super().put(key, data)

    store = Flaky(tmp_path)
    up = Uploader(store, "w0", interval_s=3600, max_backlog=8)
    up.add(Segment(arrays(2), opponents=["latest"]))
    up.flush()
    named = up._backlog[0].key
    time.sleep(0.01)
    up.flush()
    assert store.list("experience/") == [named]


def test_the_layout_is_written_once_and_read_by_workers(tmp_path):
    store = LocalStore(tmp_path)
    assert read_layout(store) is None
    assert write_layout(store, 8) == 8
    assert write_layout(store, 3) == 8  # a second optimizer (a resume with other ranks) keeps the run's
    assert read_layout(store) == 8
    store.put(LAYOUT, b'{"format": "rapid.layout", "version": 1, "experience_shards": 1e999}')
    with pytest.raises(FormatError):
        read_layout(store)


def test_shards_spread_one_workers_objects_over_every_rank():
    shards = [shard_of(f"w0-inc-{seq}", 16) for seq in range(2000)]
    counts = np.bincount(shards, minlength=16)
    assert counts.min() > 80 and counts.max() < 170


def test_games_reach_the_league_through_the_loaders_tally(tmp_path):
    store = LocalStore(tmp_path)
    lost = {**GAME, "winner": "opponent"}
    put(store, 0, time.time(), 1, episodes=[GAME, lost])
    put(store, 1, time.time(), 2, episodes=[GAME])
    ranks = [loader_on(store, rank=r, world=2, shards=2) for r in (0, 1)]
    for loader in ranks:
        loader.poll_once()
    blobs = [loader.take_tally().encode() for loader in ranks]  # what all_gather_bytes hands rank 0
    keeper = LeagueKeeper(store, Config())
    keeper.fold(Tally.merge([Tally.decode(b) for b in blobs]))
    keeper.close()
    assert League(store).read().latest_games == 3 and keeper.folded_games == 3
    assert store.list("league/results/") == []  # no per-game objects
    assert all(not loader.take_tally().counts for loader in ranks)  # taken once


def test_the_league_keeper_never_blocks_its_caller(tmp_path):
    """A pool commit that hangs (a slow store) holds up only the league's thread: fold and after_publish
    return at once, and the tallies handed over meanwhile are merged into the next commit."""
    store = LocalStore(tmp_path)
    keeper = LeagueKeeper(store, Config())
    gate = threading.Event()
    real = keeper.league.update

    def slow(fn):
        gate.wait(10)
        return real(fn)

    keeper.league.update = slow
    started = time.perf_counter()
    for _ in range(50):
        keeper.fold(Tally({"latest": [1, 0, 0]}))
        keeper.after_publish(10, {"w": np.zeros(2, np.float32)})
    assert time.perf_counter() - started < 0.5
    gate.set()
    keeper.close()
    assert League(store).read().latest_games == 50


def test_a_run_of_an_older_rapid_resumes_and_says_its_old_experience_is_ignored(tmp_path, caplog):
    import logging

    from rapid.roles.optimizer import _write_layout

    store = LocalStore(tmp_path)
    store.put("experience/w0/1700000000abc-00000001.rxp", b"an object of the old layout")
    caplog.set_level(logging.INFO)
    _write_layout(store, Config(), world=2, resume=True, log=logging.getLogger("test"))
    assert read_layout(store) == 2
    assert any("older rapid" in r.getMessage() for r in caplog.records)
    assert store.list("experience/w0/") == ["experience/w0/1700000000abc-00000001.rxp"]  # nothing deleted
    caplog.clear()
    _write_layout(store, Config(), world=4, resume=True, log=logging.getLogger("test"))  # resumed on 4 ranks
    assert read_layout(store) == 2 and not any("older rapid" in r.getMessage() for r in caplog.records)


def test_a_garbled_layout_stops_the_optimizer_with_one_line(tmp_path):
    import logging

    from rapid.errors import UsageError
    from rapid.roles.optimizer import _write_layout

    store = LocalStore(tmp_path)
    store.put(LAYOUT, b"\x00not json")
    with pytest.raises(UsageError, match="layout.json is not a rapid layout document"):
        _write_layout(store, Config(), world=1, resume=True, log=logging.getLogger("test"))
    assert store.get(LAYOUT) == b"\x00not json"  # nothing overwritten


def test_games_without_samples_wait_for_the_next_object(tmp_path):
    """A worker's first segment can finish games before it has a sample (GAE holds the samples back): an
    object of games alone would be refused by every rank, so the games go out with the next samples."""
    store = LocalStore(tmp_path)
    up = Uploader(store, "w0", interval_s=3600, max_backlog=8)
    up.add(Segment(arrays(0), opponents=["latest"], episodes=[GAME, GAME], env_steps=30))
    up.flush()
    assert store.list("experience/") == [] and up.stats.objects == 0
    up.add(Segment(arrays(3), opponents=["latest"], episodes=[GAME], env_steps=40))
    up.flush()
    (key,) = store.list("experience/")
    batch = decode_experience(store.get(key), SHAPE)
    assert batch.num_samples == 3 and len(batch.episodes) == 3 and batch.env_steps == 70


def test_a_restarted_rank_does_not_load_again_what_it_loaded(tmp_path):
    """The rank notes how far it has loaded each shard (loader/…); a restarted rank skips what was loaded
    before the note, loads what came after, and retention still deletes the skipped objects."""
    store = LocalStore(tmp_path)
    clock = [time.time()]
    before = [put(store, 0, clock[0] - 200 + i, i) for i in range(5)]  # named 200 s ago: loaded, then noted
    first = loader_on(store, retention_s=300, mark_s=10.0, clock=lambda: clock[0])
    assert first.poll_once() == 5
    clock[0] += 11.0
    assert first.poll_once() == 0  # the note is written now: everything named before now − lookback is loaded
    assert store.list("loader/") == ["loader/s0000-0of1.json"]
    later = put(store, 0, clock[0], 99)  # uploaded while the rank was away
    second = loader_on(store, retention_s=300, mark_s=10.0, clock=lambda: clock[0])  # the restart
    assert second.poll_once() == 1 and second.stats.objects == 1 and later in second._seen
    clock[0] += 400  # past retention: the skipped objects go too, nothing grows
    second.poll_once()
    assert store.list("experience/") == [] and second.stats.deleted == len(before) + 1


def test_no_note_while_a_download_failed(tmp_path):
    class Flaky(LocalStore):
        fail = True

        def get(self, key, **kw):
            if self.fail and key.startswith("experience/"):
                from rapid.infra.store import StoreError

                raise StoreError("timeout")
            return super().get(key, **kw)

    store = Flaky(tmp_path)
    put(store, 0, time.time() - 200, 1)
    loader = loader_on(store, mark_s=0.001)
    time.sleep(0.01)
    assert loader.poll_once() == 0 and store.list("loader/") == []  # the object is retried, not noted as done


def test_after_a_clean_stop_a_restart_loads_nothing_twice(tmp_path):
    store = LocalStore(tmp_path)
    recent = [put(store, 0, time.time() - 5 + i, i) for i in range(4)]  # inside the lookback: not past the cursor
    first = loader_on(store, mark_s=3600.0)
    assert first.poll_once() == 4
    first.start()
    first.stop()  # a clean stop notes the keys loaded since the cursor too
    later = put(store, 0, time.time(), 9)
    second = loader_on(store, mark_s=3600.0)
    assert second.poll_once() == 1 and later in second._seen and set(recent) <= second._seen


def test_workers_share_their_objects_evenly_between_the_shards_however_long_they_run(tmp_path):
    """Ranks in lock step train the same batches: a rank whose shards got more experience than another's wastes
    the rest. Each worker's objects go round the shards, so after any number of uploads no shard is more than one
    object a worker ahead of another (hashing each object alone drifted: 55 against 36 objects after 5 minutes
    of 16 workers on 2 shards in the scale model)."""
    store, shards = LocalStore(tmp_path), 4
    workers = [Uploader(store, f"w{i}", interval_s=3600, max_backlog=8, shards=shards) for i in range(8)]
    for uploads in range(1, 41):
        for up in workers:
            up.add(Segment(arrays(1), opponents=["latest"]))
            up.flush()
        counts = [len(store.list(f"experience/s{s:04d}/")) for s in range(shards)]
        assert sum(counts) == 8 * uploads and max(counts) - min(counts) <= len(workers), (uploads, counts)
    assert counts == [80] * shards
