"""The scale model's S3 (benchmarks/fleet/store.py, s3rules.py, store_args.py) behaves like S3 where the
fleet can tell: an overwrite serves the old bytes until the new PUT completes, latency has a tail, 500s
and resets are retried as botocore's standard mode retries them, partitions split under sustained load,
and the faults the scale model injects (hung GETs, a PUT outage) happen as asked. Unit tests on the
in-memory model, no server, deterministic (seeded)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))

from fleet.calibrate import fit, measure  # noqa: E402
from fleet.clock import SimClock  # noqa: E402
from fleet.meter import OPS, Latency, Meter  # noqa: E402
from fleet.s3rules import Retry  # noqa: E402
from fleet.store import ModelStore  # noqa: E402
from fleet.store_args import add_store_args, store_settings  # noqa: E402

from rapid.infra.store import KeyNotFound, StoreError  # noqa: E402

FLAT = Latency({"PUT": 0.02, "GET": 0.02, "HEAD": 0.01, "DELETE": 0.01, "LIST": 0.1}, 100e6, {})


def model(latency: Latency = FLAT, **kw) -> tuple[SimClock, Meter, ModelStore]:
    clock = SimClock()
    meter = Meter(clock, latency, math.inf, math.inf)
    return clock, meter, ModelStore(meter, **kw)


def attempts(meter: Meter) -> int:
    return sum(meter.requests.values())


# -- (a) an overwrite serves the old bytes until the new PUT completes ----------------------------------------

def test_an_overwrite_serves_the_old_bytes_until_the_new_put_completes():
    slow_puts = Latency({"PUT": 1.0, "GET": 0.02, "HEAD": 0.01, "DELETE": 0.01, "LIST": 0.1}, 100e6, {})
    clock, meter, store = model(slow_puts)
    with clock.acting("writer", 0.0):
        store.put("league/pool/LATEST", b"old")
    with clock.acting("writer", 10.0):
        store.put("league/pool/LATEST", b"new")  # in flight from 10 s, complete at 11 s
        assert clock.t() == pytest.approx(11.0)
    with clock.acting("reader", 10.5):  # run after the writer's step, reading while its PUT is in flight
        assert store.get("league/pool/LATEST") == b"old"
        assert store.exists("league/pool/LATEST")
        assert store.list("league/pool/") == ["league/pool/LATEST"]
    with clock.acting("reader", 11.5):
        assert store.get("league/pool/LATEST") == b"new"
    assert store.peek("league/pool/LATEST") == b"new" and store.live()["league/pool"][0] == 1


def test_a_delete_takes_effect_when_it_completes_and_a_new_key_only_once_written():
    clock, meter, store = model()
    with clock.acting("w", 0.0):
        store.put("params/v1", b"1")
    with clock.acting("w", 5.0):
        clock.charge(2.0)
        store.delete("params/v1")  # completes at 7.01
        store.put("params/v2", b"2")  # completes at 7.03
    with clock.acting("r", 6.0):
        assert store.get("params/v1") == b"1"
        assert store.list("params/") == ["params/v1"]
        with pytest.raises(KeyNotFound):
            store.get("params/v2")
    with clock.acting("r", 8.0):
        assert store.list("params/") == ["params/v2"]
        assert not store.exists("params/v1")
    assert store.live() == {"params": (1, 1.0)}


def test_put_if_absent_refuses_a_key_whose_first_put_is_in_flight():
    clock, meter, store = model()
    with clock.acting("a", 0.0):
        clock.charge(3.0)
        assert store.put_if_absent("league/results/x", b"a")
    with clock.acting("b", 1.0):  # before a's PUT completed: S3 answers 409/412, never two winners
        assert not store.put_if_absent("league/results/x", b"b")
    with clock.acting("r", 4.0):
        assert store.get("league/results/x") == b"a"


# -- (b) latency drawn with a tail, its mean settable ----------------------------------------------------------

def test_latency_has_a_lognormal_tail_around_the_mean_it_is_given():
    latency = Latency({"GET": 0.02}, 100e6, {}, sigma={"GET": 1.0}, seed=3)
    draws = np.array([latency.draw("GET") for _ in range(40_000)])
    p50, p99 = np.percentile(draws, [50, 99])
    assert draws.mean() == pytest.approx(0.02, rel=0.05)
    assert p99 / p50 >= 10.0
    again = Latency({"GET": 0.02}, 100e6, {}, sigma={"GET": 1.0}, seed=3)
    assert [again.draw("GET") for _ in range(5)] == list(draws[:5])  # the seed makes a run repeatable
    assert FLAT.draw("GET") == FLAT.draw("GET") == 0.02  # no sigma: the constant of today's tests


def test_store_args_default_to_a_tail_and_keep_the_mean_settable():
    p = argparse.ArgumentParser()
    p.add_argument("--request-ms", type=float, default=20.0)
    p.add_argument("--list-ms", type=float, default=100.0)
    add_store_args(p)
    cfg = store_settings(p.parse_args(["--request-ms", "40", "--latency-ms", "LIST=250", "--latency-sigma",
                                       "HEAD=0", "--error-rate", "0.01"]))
    assert cfg.mean_s == {"PUT": 0.04, "GET": 0.04, "HEAD": 0.02, "DELETE": 0.02, "LIST": 0.25}
    assert cfg.sigma["HEAD"] == 0 and all(math.exp(2.326 * cfg.sigma[op]) >= 10 for op in OPS if op != "HEAD")
    latency = cfg.latency(100e6, {}, seed=0)
    assert np.mean([latency.draw("PUT") for _ in range(20_000)]) == pytest.approx(0.04, rel=0.05)
    assert cfg.store(Meter(SimClock(), latency, 1, 1)).error_rate == 0.01
    for bad in (["--error-rate", "2"], ["--latency-sigma", "PUT=x"], ["--latency-ms", "GOT=3"]):
        with pytest.raises(SystemExit) as e:
            p.parse_args(bad)
        assert e.value.code == 2


def test_the_calibration_fit_recovers_the_model_it_measures():
    latency = Latency({op: 0.01 for op in OPS}, 1e12, {}, sigma={op: 0.6 for op in OPS}, seed=5)
    clock, meter, store = model(latency)
    with clock.acting("calibration", 0.0):
        took = measure(store, n=400, now=clock.t)
    fitted = fit(took, big_list_s=3 * 0.01, big_pages=3)
    for op in OPS:
        assert fitted["latency_sigma"][op] == pytest.approx(0.6, abs=0.08)
    for op in ("PUT", "GET", "HEAD", "DELETE"):
        assert fitted["latency_ms"][op] == pytest.approx(10.0, rel=0.15)
    assert fitted["list_key_ms"] < 0.01


# -- (c) 500s and resets, retried like botocore's standard mode ---------------------------------------------

@pytest.mark.parametrize("kind", ["error_rate", "reset_rate"])
def test_errors_are_retried_five_times_then_raised(kind):
    clock, meter, store = model(**{kind: 1.0})
    code = "InternalError" if kind == "error_rate" else "reset"
    with clock.acting("w", 0.0), pytest.raises(StoreError, match=code):
        store.put("params/v1", b"x")
    assert attempts(meter) == 5 and meter.errors["params", code] == 5 and meter.raised["params", code] == 1
    assert not meter.failed  # failed counts SlowDown only
    assert 0.05 < clock.t() < 0.05 + 0.05 * (1 + 2 + 4 + 8)  # 5 latencies and 4 waits of rand × 50 ms × 2^i


def test_errors_at_a_rate_are_counted_and_absorbed_by_the_retries():
    clock, meter, store = model(error_rate=0.05, reset_rate=0.05, seed=1)
    with clock.acting("w", 0.0):
        for i in range(2000):
            store.put(f"experience/s0/{i:05d}.rxp", b"x")
    errors = meter.errors["experience", "InternalError"], meter.errors["experience", "reset"]
    assert all(70 < n < 140 for n in errors)  # 5% of some 2,200 attempts each
    assert attempts(meter) == 2000 + sum(errors) and not meter.raised


def test_the_retry_quota_of_a_client_runs_out_as_botocores_does():
    clock, meter, store = model(error_rate=1.0)
    tried = []
    with clock.acting("w", 0.0):
        for i in range(12):
            before = attempts(meter)
            with pytest.raises(StoreError):
                store.get(f"params/v{i}")
            tried.append(attempts(meter) - before)
    # 500 / 14 a retry: eight calls retry 4 times (448), the ninth 3 times (490), then no retry is left
    assert tried == [5] * 8 + [4] + [1] * 3
    assert store.retry.quota("w") == 10 and store.retry.quota("other client") == Retry.CAPACITY
    store.error_rate = 0.0
    with clock.acting("w", 1.0):
        store.put("params/ok", b"x")
    assert store.retry.quota("w") == 11  # a success without retries gives 1 back


# -- (d) per-prefix partitions that split under sustained load ----------------------------------------------

def test_a_prefix_starts_as_one_partition_and_splits_under_sustained_load():
    clock, meter, store = model(write_limit=10, split_after_s=5, attempts=1)
    refused = []
    for second in range(10):
        with clock.acting("w", float(second)):
            for i in range(20):  # twice a partition's limit, over 20 keys
                try:
                    store.put(f"league/results/w{i:02d}", b"x")
                except StoreError:
                    refused.append(second)
    counts = [refused.count(s) for s in range(10)]
    assert counts[:4] == [10] * 4  # one partition: 10 writes/s
    # after 5 s of load it split at the median of the demand (w09: 9 keys below, 11 above), then the halves
    # still loaded past half their limit split again
    assert counts[5:] == [1, 1, 1, 1, 0]
    assert store.partitions.splits[0] == (4, "league/results", "league/results/w09")
    assert store.partitions.count()["league/results"] == 1 + len(store.partitions.splits) >= 3
    assert meter.throttled["league/results"] == meter.failed["league/results"] == sum(counts)


def test_keys_that_grow_with_time_gain_nothing_from_a_split():
    clock, meter, store = model(write_limit=10, split_after_s=3, attempts=1)
    served = []
    for second in range(8):
        with clock.acting("w", float(second)):
            n = 0
            for i in range(20):
                try:
                    store.put(f"experience/s0000/{second:04d}{i:03d}.rxp", b"x")  # as rapid names them
                    n += 1
                except StoreError:
                    pass
            served.append(n)
    assert store.partitions.count()["experience/s0000"] >= 2 and served == [10] * 8


def test_one_hot_key_never_splits_and_other_prefixes_keep_their_own_budget():
    clock, meter, store = model(read_limit=10, split_after_s=3, attempts=1)
    with clock.acting("w", 0.0):
        store.put("params/LATEST", b"x")
        store.put("league/pool/x", b"x")
    for second in range(1, 10):
        with clock.acting("r", float(second)):
            served = 0
            for _ in range(15):
                try:
                    store.get("params/LATEST")
                    served += 1
                except StoreError:
                    pass
            assert served == 10
            assert store.get("league/pool/x") == b"x"  # another prefix has its own partition
    assert store.partitions.count() == {"params": 1, "league/pool": 1}


def test_slowdown_is_retried_with_the_throttle_backoff():
    clock, meter, store = model(write_limit=3)
    with clock.acting("w", 0.0):
        for i in range(4):
            store.put(f"params/{i}", b"x")  # the fourth waits into the next second
    assert meter.throttled["params"] >= 1 and not meter.failed
    assert 1.0 <= clock.t() < 1.0 + 1 + 2 + 4  # waits of rand × 1 s × 2^i after a throttle


# -- (e), (f) the faults the scale model injects ------------------------------------------------------------

def test_hang_gets_delays_the_next_gets_of_one_key():
    clock, meter, store = model()
    with clock.acting("w", 0.0):
        store.put("params/LATEST", b"x")
        store.put("params/v1", b"x")
    store.hang_gets("params/LATEST", 60.0, count=2)
    took = []
    for i, key in enumerate(["params/v1", "params/LATEST", "params/LATEST", "params/LATEST"]):
        with clock.acting(f"r{i}", 10.0):
            store.get(key)
            took.append(round(clock.elapsed, 3))
    assert took == [0.02, 60.02, 60.02, 0.02]


def test_fail_puts_is_an_outage_of_one_key_family_for_a_window():
    clock, meter, store = model()
    store.fail_puts("params/", 100.0, 200.0)
    with clock.acting("w", 50.0):
        store.put("params/v1", b"1")
    with clock.acting("w", 120.0):
        with pytest.raises(StoreError, match="InternalError"):
            store.put("params/v2", b"2")
        store.put("experience/s0/a.rxp", b"x")  # other families write on
        assert store.get("params/v1") == b"1"  # and reads are served
    with clock.acting("w", 199.9):  # the retries run past the window's end: the PUT goes through
        store.put("params/v3", b"3")
    assert meter.errors["params", "InternalError"] >= 6 and meter.raised["params", "InternalError"] == 1
    with clock.acting("r", 300.0):
        assert store.list("params/") == ["params/v1", "params/v3"]


def test_a_seeded_model_repeats_itself():
    def run():
        latency = Latency({op: 0.02 for op in OPS}, 100e6, {}, sigma={op: 1.0 for op in OPS}, seed=7)
        clock, meter, store = model(latency, seed=7, error_rate=0.1, reset_rate=0.1, write_limit=50,
                                    split_after_s=2)
        ends = []
        for second in range(5):
            with clock.acting("w", float(second)):
                for i in range(80):
                    try:
                        store.put(f"experience/s0/{second}-{i:03d}.rxp", b"x")
                    except StoreError:
                        pass
                ends.append(clock.t())
        return ends, dict(meter.errors), store.partitions.splits

    assert run() == run()
