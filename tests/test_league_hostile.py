"""Issue 12, items 3–6: hostile names and documents in a run's store never stop a role or fake a version.

Each test plants the object a real run could meet (another run's export, a stray file, a hand-edited
pool document) in a real LocalStore and drives the code that reads it.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from rapid.errors import UsageError
from rapid.infra.store import LocalStore
from rapid.league import cli
from rapid.league.pool import League
from rapid.league.results import MatchResult, ResultFolder, ResultWriter
from rapid.league.sampling import OpponentSampler, SamplingConfig
from rapid.league.state import Member, PoolState, version_id
from rapid.matches import resolve_version
from rapid.param_store import ParameterStore
from rapid.store_map import parse_params_key, parse_pool_revision_key, parse_version_text

UNICODE_DIGITS = ["²³", "٣", "٠٠٠٠٠٠٠٠٠٠٠٧", "７", "߁"]  # superscript, Arabic-Indic, fullwidth, NKo


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "run")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rapid")
    cli.build_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["league", *argv])


def plant(store: LocalStore, key: str, data: bytes) -> None:
    """A file a key validator would refuse, written straight into the store's folder."""
    path = store.root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# --- 5. names of Unicode digits ----------------------------------------------------------------------

def test_unicode_digit_names_are_not_versions(store):
    params = ParameterStore(store)
    params.publish(2, {"w": np.zeros(2, np.float32)})
    league = League(store)
    league.update(lambda s: PoolState(members={"bot:random": Member("bot:random", "bot", None)}))
    for digits in UNICODE_DIGITS:
        plant(store, f"params/{digits}.rpm", b"x")
        plant(store, f"league/pool/{digits}.json", b"{}")
        assert parse_params_key(f"params/{digits}.rpm") is None
        assert parse_pool_revision_key(f"league/pool/{digits}.json") is None
        assert parse_version_text(digits) is None and parse_version_text(f"v{digits}") is None
    assert params.versions() == [2]
    (store.root / "league" / "pool.json").unlink()  # readers now find the head by listing revisions
    assert set(league.read().members) == {"bot:random"}
    sampler = OpponentSampler(league, SamplingConfig(), refresh_s=0)  # what a rollout worker runs
    sampler.refresh(force=True)
    assert sampler.refresh_errors == 0 and set(sampler.state.members) == {"bot:random"}
    for digits in UNICODE_DIGITS:
        with pytest.raises(UsageError, match="unknown league member"):
            cli.run(parse("pin", digits), store)
        with pytest.raises(UsageError):
            resolve_version(params, digits)
    assert parse_params_key("params/000000000002.rpm") == 2 and parse_version_text("v12") == 12


# --- 4. odd names under league/results/ --------------------------------------------------------------

def test_odd_result_names_are_counted_once_and_folding_goes_on(store):
    league = League(store)
    league.update(lambda s: PoolState(members={version_id(1): Member(version_id(1), "snapshot", 1)}))
    for key in ("league/results/w0/a b.rmr", "league/results/ü/000000000001.rmr", "league/results/w0/²³.rmr",
                "league/results/w0/.rmr"):
        plant(store, key, b"x")
    writer = ResultWriter(store, "w1")
    writer.write([MatchResult(3, version_id(1), "learner", 10, "w1", 1.0)])
    folder = ResultFolder(league)
    report = folder.fold_pending()
    assert (report.objects, report.games, report.bad_objects) == (1, 1, 4)
    writer.write([MatchResult(3, version_id(1), "opponent", 10, "w1", 2.0)])
    report = folder.fold_pending()
    assert (report.objects, report.games, report.bad_objects) == (1, 1, 0), "counted once, then skipped"
    m = league.read().members[version_id(1)]
    assert (m.games, m.wins, m.losses) == (2, 1, 1)
