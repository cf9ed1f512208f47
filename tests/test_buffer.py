"""ExperienceBuffer: staleness drops, reuse bound, least-used-first sampling, eviction, stats."""

from __future__ import annotations

import numpy as np

from rapid.opt.buffer import ExperienceBuffer


def batch(n, version, start=0):
    return {"version": np.full(n, version, np.int64), "id": np.arange(start, start + n, dtype=np.int64),
            "obs": np.arange(start, start + n, dtype=np.float32)[:, None].repeat(3, 1)}


def test_stale_samples_dropped_and_counted():
    buf = ExperienceBuffer(capacity=100, max_staleness=2)
    buf.add(batch(10, version=1, start=0))
    buf.add(batch(5, version=4, start=10))
    rng = np.random.default_rng(0)
    out, staleness = buf.sample(5, current_version=4, rng=rng)   # v1 is 3 behind > 2: dropped
    assert set(out["id"].tolist()) == set(range(10, 15))
    assert (staleness == 0).all()
    s = buf.stats()
    assert s.dropped_stale == 10 and s.size == 5 and s.received == 15 and s.consumed == 5
    # exactly max_staleness behind is kept
    buf2 = ExperienceBuffer(capacity=10, max_staleness=2)
    buf2.add(batch(3, version=2))
    out, staleness = buf2.sample(3, current_version=4, rng=rng)
    assert (staleness == 2).all() and buf2.stats().dropped_stale == 0
    # not enough fresh samples: None
    assert buf.sample(6, current_version=4, rng=rng) is None
    assert buf.sample(1, current_version=100, rng=rng) is None
    # the 5 used samples retire; only never-used samples count as dropped (wasted experience)
    assert buf.stats().dropped_stale == 10 and buf.stats().retired_stale == 5 and buf.stats().size == 0


def test_reuse_bound_blocks_sampling():
    buf = ExperienceBuffer(capacity=100, max_staleness=10)
    rng = np.random.default_rng(1)
    buf.add(batch(10, version=0))
    assert buf.sample(10, 0, rng, max_reuse=2.0) is not None
    assert buf.sample(10, 0, rng, max_reuse=2.0) is not None
    assert buf.sample(10, 0, rng, max_reuse=2.0) is None       # 30 consumed / 10 received > 2
    assert buf.sample(5, 0, rng, max_reuse=2.0) is None
    s = buf.stats()
    assert s.consumed == 20 and s.reuse == 2.0
    buf.add(batch(5, version=0, start=10))                      # new data lifts the bound
    assert buf.sample(10, 0, rng, max_reuse=2.0) is None        # only 5 samples are below 2 uses
    out, _ = buf.sample(5, 0, rng, max_reuse=2.0)
    assert set(out["id"].tolist()) == set(range(10, 15))
    assert buf.stats().reuse == 25 / 15
    # no bound: keeps sampling the same data
    for _ in range(5):
        assert buf.sample(10, 0, rng) is not None


def test_least_used_first():
    buf = ExperienceBuffer(capacity=100, max_staleness=10)
    rng = np.random.default_rng(2)
    buf.add(batch(12, version=0))
    seen = []
    for _ in range(3):
        out, _ = buf.sample(4, 0, rng)
        seen.append(set(out["id"].tolist()))
    assert set().union(*seen) == set(range(12))                 # three draws of 4 cover all 12, no repeats
    assert sum(len(s) for s in seen) == 12
    buf.add(batch(2, version=0, start=100))
    out, _ = buf.sample(3, 0, rng)
    assert {100, 101} <= set(out["id"].tolist())                # unused samples come first
    # rows stay consistent across arrays
    np.testing.assert_array_equal(out["obs"][:, 0], out["id"].astype(np.float32))


def test_ties_broken_at_random():
    firsts = set()
    for seed in range(20):
        buf = ExperienceBuffer(capacity=50, max_staleness=10)
        buf.add(batch(50, version=0))
        out, _ = buf.sample(1, 0, np.random.default_rng(seed))
        firsts.add(int(out["id"][0]))
    assert len(firsts) > 5


def test_capacity_eviction_and_stats():
    buf = ExperienceBuffer(capacity=8, max_staleness=10)
    rng = np.random.default_rng(3)
    buf.add(batch(6, version=0, start=0))
    buf.sample(2, 0, rng)                                       # 2 of the first 6 used
    buf.add(batch(6, version=1, start=6))                       # overwrites the 4 oldest slots
    s = buf.stats()
    assert s.size == 8 and s.received == 12
    out, _ = buf.sample(8, 1, rng)
    ids = set(out["id"].tolist())
    assert ids == {4, 5} | set(range(6, 12))                    # the oldest left first
    # of the 4 overwritten (ids 0-3), those never used are counted
    assert 2 <= buf.stats().evicted_unused <= 4
    # an oversized batch keeps its newest part
    big = ExperienceBuffer(capacity=5, max_staleness=10)
    big.add(batch(12, version=0))
    out, _ = big.sample(5, 0, rng)
    assert set(out["id"].tolist()) == set(range(7, 12))
    assert big.stats().received == 5


def test_empty_buffer():
    buf = ExperienceBuffer(capacity=4, max_staleness=1)
    assert buf.sample(1, 0, np.random.default_rng(0)) is None
    s = buf.stats()
    assert (s.received, s.consumed, s.dropped_stale, s.size, s.reuse) == (0, 0, 0, 0, 0.0)


def test_sample_waits_for_data_from_another_thread():
    import threading

    buf = ExperienceBuffer(capacity=10, max_staleness=5)
    t = threading.Timer(0.05, lambda: buf.add(batch(3, version=0)))
    t.start()
    out = buf.sample(3, 0, np.random.default_rng(0), timeout=30.0)
    t.join()
    assert out is not None and len(out[0]["id"]) == 3


def test_max_reuse_bounds_each_sample_despite_wasted_samples():
    """Issue 11 bug 3: samples evicted or gone stale before any use must not buy extra passes over the rest."""
    rng = np.random.default_rng(4)
    # gone stale unused, then fresh data: with max_reuse = 1 each fresh sample is drawn at most once
    buf = ExperienceBuffer(capacity=100, max_staleness=1)
    buf.add(batch(10, version=0, start=0))
    buf.add(batch(10, version=2, start=10))
    first, _ = buf.sample(10, 2, rng, max_reuse=1.0)
    assert set(first["id"].tolist()) == set(range(10, 20)) and buf.stats().dropped_stale == 10
    assert buf.sample(10, 2, rng, max_reuse=1.0) is None
    assert buf.sample(1, 2, rng, max_reuse=1.0) is None
    # evicted unused: the same
    buf = ExperienceBuffer(capacity=10, max_staleness=10)
    buf.add(batch(10, version=0, start=0))
    buf.add(batch(10, version=0, start=10))
    assert buf.stats().evicted_unused == 10
    assert buf.sample(10, 0, rng, max_reuse=1.0) is not None
    assert buf.sample(5, 0, rng, max_reuse=1.0) is None
    s = buf.stats()
    assert s.consumed == 10 and s.used == 10 and s.reuse == 10 / 20      # the true consumed / received


def test_fractional_max_reuse_caps_each_sample_and_the_total():
    rng = np.random.default_rng(5)
    buf = ExperienceBuffer(capacity=100, max_staleness=10)
    buf.add(batch(10, version=0))
    uses = np.zeros(10, int)
    while (got := buf.sample(5, 0, rng, max_reuse=1.5)) is not None:
        uses[got[0]["id"]] += 1
    assert uses.max() <= 2 and uses.sum() == 15 and (uses >= 1).all()     # least-used first: all once
    assert buf.stats().used == 10 and buf.stats().unused == 0


def test_a_batch_of_never_used_samples_is_served_even_past_the_reuse_budget():
    """An optimizer rank short of fresh samples may reuse some (up to optimizer.max_reuse, beside peers in lock
    step); its later fresh samples must still be drawn at the target reuse of 1, or they sit unused until they go
    stale (the scale model left 1,702 of 48,640 samples so)."""
    buf = ExperienceBuffer(capacity=64, max_staleness=8)
    rng = np.random.default_rng(0)
    buf.add(batch(4, 0))
    assert buf.sample(4, 0, rng, max_reuse=2.0) is not None and buf.sample(4, 0, rng, max_reuse=2.0) is not None
    buf.add(batch(4, 0, start=4))  # consumed 8 of 8 received: at reuse 1 no budget is left, yet these 4 are fresh
    drawn = buf.sample(4, 0, rng, max_reuse=1.0)
    assert drawn is not None and buf.stats().used == 8
    assert buf.sample(1, 0, rng, max_reuse=1.0) is None  # a second use is still refused at reuse 1


def test_a_grown_buffer_keeps_what_it_held_in_order_and_evicts_the_oldest_first():
    buf = ExperienceBuffer(capacity=6, max_staleness=10, keep_reference=True)
    rng = np.random.default_rng(0)
    buf.add({**batch(4, version=1, start=0), "logp": np.zeros(4, np.float32)})
    buf.add({**batch(4, version=1, start=4), "logp": np.zeros(4, np.float32)})   # wrapped: 0, 1 evicted unused
    used, _ = buf.sample(2, current_version=1, rng=rng)
    assert not buf.grow(6) and not buf.grow(3), "a ring never shrinks"
    assert buf.grow(10) and buf.capacity == 10
    s = buf.stats()
    assert (s.size, s.unused, s.received, s.evicted_unused) == (6, 4, 8, 2)
    buf.remember(used, np.zeros((2,), np.float32))   # drawn before the growth: its slots moved, nothing is kept
    assert np.isnan(buf._arrays["reference_logp"][:6]).all()
    buf.add({**batch(4, version=1, start=8), "logp": np.zeros(4, np.float32)})    # room for all: none evicted
    assert buf.stats().evicted_unused == 2 and buf.stats().size == 10
    buf.add({**batch(3, version=1, start=12), "logp": np.zeros(3, np.float32)})   # then the oldest: 2, 3, 4
    out, _ = buf.sample(10, current_version=1, rng=rng, max_reuse=2.0)
    assert sorted(out["id"].tolist()) == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    assert buf.stats().evicted_unused == 2 + sum(i not in used["id"] for i in (2, 3, 4))
