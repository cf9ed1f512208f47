"""The scale model (benchmarks/bench_fleet.py) stays runnable: a tiny fleet on the in-memory S3 model loads
every object exactly once, its counters count, and the model answers SlowDown past S3's per-prefix rates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))

from fleet import clock as sim_clock  # noqa: E402
from fleet.plane import detect  # noqa: E402
from fleet.report import figures  # noqa: E402
from fleet.sim import Fleet, Settings  # noqa: E402
from fleet.store import Latency, Meter, ModelStore  # noqa: E402

from rapid.infra.store import StoreError  # noqa: E402

LATENCY = Latency({"PUT": 0.02, "GET": 0.02, "HEAD": 0.01, "DELETE": 0.01, "LIST": 0.1}, 100e6, {})


def model(sim_s: float = 100.0, **limits) -> tuple[sim_clock.SimClock, Meter, ModelStore]:
    clock = sim_clock.SimClock()
    meter = Meter(clock, LATENCY, sim_s / 2, sim_s)
    return clock, meter, ModelStore(meter, **limits)


def test_a_small_fleet_loads_every_object_once():
    s = Settings(workers=8, ranks=2, sim_s=240.0, drain_s=60.0, churn=0.25, skew_s=30.0, slow_upload_s=2.0)
    clock, meter, store = model(s.sim_s)
    with sim_clock.installed(clock) as patched:
        assert "rapid.loader" in patched and "rapid.uploader" in patched
        fleet = Fleet(s, store, meter, clock, detect())
        fleet.run()
        fig = figures(fleet, fleet.live_half, store.live())
    assert fig["uploaded"] >= 8 * 3
    assert (fig["never_loaded"], fig["loaded_twice"], fig["bad"]) == (0, 0, 0)
    assert fig["families"]["experience"]["PUT"] > 0 and fig["families"]["params/LATEST"]["GET"] > 0
    assert fig["updates"] > 0 and fig["cost_per_h"] > 0
    assert fig["churned"] > 0


def test_list_pages_and_start_after_like_s3():
    clock, meter, store = model(sim_s=1000.0)
    with clock.acting("lister", 0.0):
        for i in range(2500):
            store.put(f"experience/s0/{i:05d}.rxp", b"x")
    with clock.acting("lister", 100.0):  # the 2,500 PUTs took 50 simulated seconds
        assert len(store.list("experience/")) == 2500
        assert store.list("experience/", start_after="experience/s0/02497.rxp") == [
            "experience/s0/02498.rxp", "experience/s0/02499.rxp"]
    assert sum(n for (f, op, _), n in meter.requests.items() if op == "LIST") == 3 + 1
    assert sum(n for (f, op, _), n in meter.requests.items() if op == "PUT") == 2500


def test_an_object_is_invisible_until_its_put_completes():
    clock, meter, store = model()
    meter.slow_put["slow"] = 5.0
    with clock.acting("slow", 0.0):
        store.put("experience/s0/a.rxp", b"x")
    with clock.acting("reader", 2.0):
        assert store.list("experience/") == []
    with clock.acting("reader", 6.0):
        assert store.list("experience/") == ["experience/s0/a.rxp"]


def test_slowdown_past_the_per_prefix_rate():
    clock, meter, store = model(write_limit=5, attempts=1)
    with clock.acting("w", 0.0):
        for i in range(5):
            store.put(f"params/{i}", b"x")
        store.put("other/x", b"x")  # another prefix has its own budget
        with pytest.raises(StoreError, match="SlowDown"):
            store.put("params/5", b"x")
    assert meter.throttled["params"] == 1 and meter.failed["params"] == 1
    clock, meter, store = model(write_limit=5, attempts=5)  # retried with backoff, as botocore does
    with clock.acting("w", 0.0):
        for i in range(8):
            store.put(f"params/{i}", b"x")
        assert clock.t() > 1.0
    assert meter.throttled["params"] >= 1 and not meter.failed
