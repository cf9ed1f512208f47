"""The scale model (benchmarks/bench_fleet.py) runs rapid's own loops, a small fleet of them is healthy by every
figure it prints, every known fault moves its figure past its bound (and an unhealthy run exits 1), every planted
bug of the mutation check still finds its text in rapid, and the model copies no loop of rapid's and reaches into
none of its privates."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.append(str(BENCH))

import bench_fleet  # noqa: E402
from fleet.report import BOUNDS  # noqa: E402

SMALL = ["--workers", "16", "--ranks", "2", "--minutes", "5", "--workers-per-node", "8", "--samples", "2",
         "--drain-s", "120"]


def run(*extra: str) -> dict:
    a = bench_fleet.parse_args([*SMALL, *extra])
    lines: list[str] = []
    fig = bench_fleet.run_once(a, "model", out=lines.append)
    fig["settings"], fig["lines"] = bench_fleet.settings_of(a), lines
    return fig


def failing(fig: dict) -> set[str]:
    from fleet.report import passes

    return {name for name in BOUNDS if not passes(name, fig[name], fig["settings"])}


@pytest.fixture(scope="module")
def healthy() -> dict:
    return run()


def test_a_small_fleet_is_healthy_by_every_figure(healthy):
    assert failing(healthy) == set(), [line for line in healthy["lines"] if "FAIL" in line]
    assert (healthy["never_loaded"], healthy["loaded_twice"], healthy["bad"]) == (0, 0, 0)
    assert healthy["uploaded"] > 16 * 4 and healthy["updates"] > 100
    assert healthy["collectives"] > 100 and healthy["families"]["params/LATEST"]["GET"] > 0
    assert any("health" in line for line in healthy["lines"])


@pytest.mark.parametrize("fault, moved", [
    ("params-outage=150", {"writer_wait_s", "fold_lag_p99_s"}),  # workers stay on the newest version stored
    # the writer refuses the object: rank 0 stops, its peers wait in the next collective
    ("wrong-meta", {"updates_share", "ranks_stop_spread_s"}),
    ("stale-drop", {"trained_share"}),
    ("keeper-stopped", {"pool_games_share", "fold_lag_p99_s"}),
    ("one-shard", {"updates_share"}),
    ("hung-get=30", {"poller_failures"}),
    ("experience-outage=150", {"trained_share", "pool_games_share"}),
    ("rank-stop", {"updates_share", "publish_cadence"}),
    ("server-killed", {"inference_restarts", "server_wait_max_s"}),  # with --inference node
    ("lease-lost", {"updates_share", "publish_cadence"}),  # rank 0 stops, every rank with it
])
def test_each_fault_moves_its_figure_past_its_bound(fault, moved):
    node = ["--inference", "node"] if fault == "server-killed" else []
    fig = run("--max-backlog", "2", "--fault", fault, *node)
    assert moved <= failing(fig)
    # Whatever the fault, every sample is trained or lost for a named reason, and the ranks update together.
    assert {"unaccounted_samples", "rank_updates_spread"}.isdisjoint(failing(fig))


def test_at_a_five_second_cadence_versions_keep_it_and_reach_every_worker():
    """moba 5v5's cadence (5 s publishes and segments, 2 s polls): versions were counted from the update that
    published them (one every 6-7 s with 1 s updates), and a worker took a new version only with what its poller
    had fetched before the segment began (each version reached its workers after 6-13 s)."""
    a = bench_fleet.parse_args(["--workers", "16", "--ranks", "2", "--minutes", "2", "--drain-s", "30",
                                "--cadence", "moba-5v5"])
    fig = bench_fleet.run_once(a, "model", out=lambda line: None)
    assert 0.9 <= fig["publish_cadence"] <= 1.2 and fig["version_reach_share"] >= 0.95, fig["failures"]


def test_an_optimizer_that_lost_its_lease_writes_nothing_more():
    """Rank 0 stopped on a lost lease used to publish its unpublished updates at its clean stop, a version among
    the new holder's (found by the model's lease-lost fault)."""
    fig = run("--max-backlog", "2", "--fault", "lease-lost")
    assert fig["writes_after_lease_lost"] == 0 and "writes_after_lease_lost" not in failing(fig)


def test_a_small_fleet_with_real_workers_is_healthy_and_follows_their_decisions():
    fig = run("--real-workers", "2")
    assert failing(fig) == set(), [line for line in fig["lines"] if "FAIL" in line]
    assert fig["ahead_share"] > 0  # the stand-in learner draws ahead as rapid's does


def test_a_real_worker_finds_a_sample_stamped_with_the_wrong_version(monkeypatch):
    from rapid.rollout.worker import RolloutWorker

    handed = RolloutWorker.collect

    def misstamped(self):  # the worker's segment, its first sample stamped a version older than its decisions'
        segment = handed(self)
        version = segment.arrays["version"][:1]
        version -= version > 0
        return segment

    monkeypatch.setattr(RolloutWorker, "collect", misstamped)
    fig = run("--real-workers", "1", "--minutes", "3")
    assert fig["samples_misstamped"] > 0 and "samples_misstamped" in failing(fig)


def test_a_small_fleet_with_node_inference_is_healthy_and_its_servers_batch():
    fig = run("--inference", "node")
    assert failing(fig) == set(), [line for line in fig["lines"] if "FAIL" in line]
    batches = fig["server_batches"]
    assert batches["batches"] > 0 and batches["rows"] > batches["batches"] and 0 < fig["server_busy_share"] < 0.9
    assert fig["families"]["params/LATEST"]["GET"] > 0  # the servers read the parameters, through the node cache


def test_an_unhealthy_run_exits_1_with_one_line_per_figure_and_its_bounds_in_the_json(tmp_path, capsys):
    import json

    out = tmp_path / "fleet.json"
    assert bench_fleet.main([*SMALL, "--fault", "keeper-stopped", "--json", str(out)]) == 1
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL ")]
    doc = json.loads(out.read_text())
    assert printed == doc["failures"] and any(line.startswith("FAIL pool_games_share = 0,") for line in printed)
    assert set(doc["bounds"]) == set(BOUNDS) and doc["bounds"]["pool_games_share"] == ["in", [0.99, 1.0]]
    assert doc["unaccounted_samples"] == 0 and doc["samples"]["made"] > 0
    assert bench_fleet.main([*SMALL, "--fault", "keeper-stopped", "--no-fail"]) == 0


def test_a_fault_named_wrong_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        bench_fleet.parse_args(["--fault", "params-outage"])
    assert e.value.code == 2 and "needs a duration" in capsys.readouterr().err


def model_sources() -> dict[str, ast.Module]:
    files = [BENCH / "bench_fleet.py", *sorted((BENCH / "fleet").glob("*.py"))]
    return {f.name: ast.parse(f.read_text()) for f in files}


def test_the_model_drives_rapids_own_loops_and_touches_no_private():
    sources = model_sources()
    imported = {alias.name for tree in sources.values() for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rapid")
                for alias in node.names}
    assert {"RolloutLoop", "OptimizerLoop", "Uploader", "ParamPoller", "ExperienceLoader", "BackgroundWriter",
            "LeagueKeeper", "NodeCachedStore", "ServerVersions", "BatchStats", "InferenceLost", "RunLease",
            "RolloutWorker", "LocalInference"} <= imported
    private = [(name, node.lineno, node.attr) for name, tree in sources.items() for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
               and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]
    assert private == []
    # What belongs inside the loops (sampling a batch, agreeing, taking a version, the league's hand-over, a
    # rollout step) is never called by the model itself: only rapid's loops call it. A stand-in's method of the
    # same name may hand the call on to rapid's part it stands in front of (RealSource.collect: the loop's call).
    loop_work = {"sample", "decide", "take", "take_tally", "fold", "after_publish", "set_params", "collect",
                 "add_snapshot", "take_episodes"}
    parts = {"poller", "buffer", "loader", "agree", "keeper", "league", "source", "sampler", "learner", "uploader",
             "writer", "worker", "loop"}

    def owner(node: ast.expr) -> str:
        return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""

    handed_on = {id(call) for tree in sources.values() for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
                 for call in ast.walk(fn) if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                 and call.func.attr == fn.name}
    called = [(name, node.lineno, node.func.attr) for name, tree in sources.items() for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in loop_work
              and owner(node.func.value) in parts and id(node) not in handed_on]
    assert called == []
    defined_loops = [(name, node.name) for name, tree in sources.items() for node in ast.walk(tree)
                     if isinstance(node, ast.ClassDef) and node.name.endswith("Loop")]
    assert defined_loops == []


def test_list_pages_and_start_after_like_s3():
    from fleet import clock as sim_clock
    from fleet.meter import Latency, Meter
    from fleet.store import ModelStore

    clock = sim_clock.SimClock()
    latency = Latency({"PUT": 0.02, "GET": 0.02, "HEAD": 0.01, "DELETE": 0.01, "LIST": 0.1}, 100e6, {})
    meter = Meter(clock, latency, 500.0, 1000.0)
    store = ModelStore(meter, error_rate=0.0, reset_rate=0.0)
    with clock.acting("lister", 0.0):
        for i in range(2500):
            store.put(f"experience/s0/{i:05d}.rxp", b"x")
    with clock.acting("lister", 100.0):  # the 2,500 PUTs took 50 simulated seconds
        assert len(store.list("experience/")) == 2500
        assert store.list("experience/", start_after="experience/s0/02497.rxp") == [
            "experience/s0/02498.rxp", "experience/s0/02499.rxp"]
    assert sum(n for (f, op, _), n in meter.requests.items() if op == "LIST") == 3 + 1
    assert sum(n for (f, op, _), n in meter.requests.items() if op == "PUT") == 2500


def test_every_mutant_plants_its_bug_and_a_planted_one_fails_its_figure(tmp_path):
    import bench_mutants
    from fleet.mutants import MUTANTS

    code = bench_mutants.install_copy(tmp_path / "copy")
    for m in MUTANTS:  # each edit's text is in rapid exactly once: none runs unmutated after a refactor
        text = (code / m.path).read_text()
        assert all(text.count(old) == 1 for old, _ in m.edits), m.name
    (node_cache,) = [m for m in MUTANTS if m.name == "node-cache-rereads-latest"]
    bench_mutants.plant(code, node_cache)
    with pytest.raises(bench_mutants.AnchorMissing):
        bench_mutants.plant(code, node_cache)  # planted once: its text is gone
    how, failures = bench_mutants.run_fleet(code, SMALL, tmp_path / "fleet.json")
    assert how == "ok" and "latest_gets_per_node_poll" in failures
