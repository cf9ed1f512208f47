"""Issue 12, items 3–6: hostile names and documents in a run's store never stop a role or fake a version.

Each test plants the object a real run could meet (another run's export, a stray file, a hand-edited
pool document) in a real LocalStore and drives the code that reads it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from rapid.errors import UsageError
from rapid.formats.params import ParamsObject
from rapid.infra.store import LocalStore, StoreError
from rapid.league import cli
from rapid.league.pool import League
from rapid.league.sampling import OpponentSampler
from rapid.league.state import (
    Member,
    PoolConflict,
    PoolFormatError,
    PoolState,
    SnapshotConflict,
    foreign_id,
    load_pool,
    version_id,
)
from rapid.run.config import LeagueConfig
from rapid.run.matches import resolve_version
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import (
    load_json,
    parse_params_key,
    parse_pool_revision_key,
    parse_version_text,
    pool_revision_key,
    snapshot_key,
)

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
    sampler = OpponentSampler(league, LeagueConfig())  # what a rollout worker runs
    sampler.refresh(force=True)
    assert sampler.refresh_errors == 0 and set(sampler.state.members) == {"bot:random"}
    for digits in UNICODE_DIGITS:
        with pytest.raises(UsageError, match="unknown league member"):
            cli.run(parse("pin", digits), store)
        with pytest.raises(UsageError):
            resolve_version(params, digits)
    assert parse_params_key("params/000000000002.rpm") == 2 and parse_version_text("v12") == 12


# --- 3. another run's export -------------------------------------------------------------------------

def two_runs(tmp_path):
    """Run A with snapshots of its versions 1 and 2 and an export; run B with other weights as 1 and 2."""
    a, b = LocalStore(tmp_path / "a"), LocalStore(tmp_path / "b")
    for store, fill in ((a, 1.0), (b, 2.0)):
        for v in (1, 2):
            ParameterStore(store).publish(v, {"w": np.full(3, fill * v, np.float32)})
    for v in ("1", "2"):
        cli.run(parse("add", "--version", v), a)
    cli.run(parse("add", "--version", "1", "--id", "keeper"), a)
    export = tmp_path / "a.rlx"
    cli.run(parse("export", str(export)), a)
    return a, b, export


def test_import_renames_another_runs_learner_ids(tmp_path, capsys):
    a, b, export = two_runs(tmp_path)
    capsys.readouterr()
    assert cli.run(parse("import", str(export)), b) == 0
    out = capsys.readouterr().out
    ext1 = foreign_id(version_id(1), a.get(snapshot_key(version_id(1))))
    assert f"renamed {version_id(1)} to {ext1}" in out
    league = League(b)
    assert version_id(1) not in league.read().members and ext1 in league.read().members
    assert league.load_policy(version_id(1)).tensors["w"].tolist() == [2.0] * 3, "B's own v1, not A's"
    assert league.load_policy(ext1).tensors["w"].tolist() == [1.0] * 3
    # The optimizer of run B can still snapshot its own versions 1 and 2.
    league.add_snapshot(ParamsObject(1, {"w": np.full(3, 2.0, np.float32)}))
    revision = league.read().revision
    assert cli.run(parse("import", str(export)), b) == 0, "importing twice adds nothing"
    assert league.read().revision == revision


def test_foreign_weights_never_take_a_learner_id(tmp_path):
    a, b, export = two_runs(tmp_path)
    league = League(b)
    # A snapshot an older import left under B's learner id: the optimizer's own snapshot of v2 is refused
    # with a league error (which it logs and survives), never a FileExistsError.
    plant(b, "league/snapshots/v000000000002.rpm", a.get(snapshot_key(version_id(2))))
    with pytest.raises(PoolConflict, match="different weights"):
        league.add_snapshot(ParamsObject(2, {"w": np.full(3, 4.0, np.float32)}))
    foreign = ParamsObject(2, {"w": np.full(3, 9.0, np.float32)})
    with pytest.raises(SnapshotConflict, match="learner version"):
        league.add_snapshot(ParamsObject(1, foreign.tensors))
    (tmp_path / "p.rpm").write_bytes(a.get("params/000000000001.rpm"))
    assert cli.run(parse("add", "--file", str(tmp_path / "p.rpm")), b) == 0
    assert foreign_id(version_id(1), a.get("params/000000000001.rpm")) in league.read().members
    with pytest.raises(UsageError, match="learner version"):
        cli.run(parse("add", "--file", str(tmp_path / "p.rpm"), "--id", version_id(1)), b)


def test_import_refuses_an_id_with_other_weights_and_writes_nothing(tmp_path):
    a, b, export = two_runs(tmp_path)
    (tmp_path / "k.rpm").write_bytes(b.get("params/000000000002.rpm"))
    cli.run(parse("add", "--file", str(tmp_path / "k.rpm"), "--id", "keeper"), b)
    before = (sorted(b.list("league/snapshots/")), League(b).read().revision)
    with pytest.raises(UsageError, match="different weights under keeper"):
        cli.run(parse("import", str(export)), b)
    assert (sorted(b.list("league/snapshots/")), League(b).read().revision) == before


def test_failed_import_commit_leaves_no_orphan_snapshot(tmp_path, monkeypatch):
    a, b, export = two_runs(tmp_path)

    def down(self, fn):
        raise StoreError("store unreachable")

    monkeypatch.setattr(League, "update", down)
    with pytest.raises(StoreError):
        cli.run(parse("import", str(export)), b)
    assert b.list("league/snapshots/") == []


# --- 6. numbers out of range in pool documents ---------------------------------------------------------

@pytest.mark.parametrize("number", ["1e999", "-1e999", "1E400", "123456789012345678901234567890"])
def test_out_of_range_numbers_in_a_pool_document_are_rejected(tmp_path, number, capsys):
    a, b, export = two_runs(tmp_path)
    league = League(a)
    doc = json.loads(a.get("league/pool.json"))
    doc["members"][0]["quality"] = "@"
    bad = json.dumps(doc).replace('"@"', number).encode()
    with pytest.raises(PoolFormatError, match="out of range"):
        load_pool(bad)
    with pytest.raises(ValueError):
        load_json(bad)
    a.put(pool_revision_key(league.read().revision + 1), bad)  # the head revision, as a bad writer left it
    with pytest.raises(PoolFormatError):
        league.read()
    sampler = OpponentSampler(league, LeagueConfig())
    sampler.refresh(force=True)
    assert sampler.refresh_errors == 1, "a rollout worker counts it and keeps playing"
    # An export holding such a pool is refused before anything is written.
    from rapid.formats import codec

    tree = codec.decode(export.read_bytes(), cli.EXPORT_FORMAT, (1,), cli.EXPORT_LIMITS)
    export.write_bytes(codec.encode(cli.EXPORT_FORMAT, 1, {**tree, "pool": bad}))
    with pytest.raises(UsageError, match="not a valid league export"):
        cli.run(parse("import", str(export)), b)
    assert b.list("league/") == []
    assert load_json(b'{"q": 1e308, "n": -9223372036854775807}') == {"q": 1e308, "n": -9223372036854775807}
