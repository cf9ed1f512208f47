"""``rapid league …``: inspect and manage the opponent pool of a run (local directory or S3).

Wiring (the top-level CLI owns the store URL option and the evaluation code)::

    commands = build_parser(subparsers)               # adds "league"; returns its subcommands' parsers
    args = parser.parse_args()
    code = run(args, open_store(args.run), play_match=play_match)   # play_match only needed by "rate"

Commands: ``ls [--all]``, ``add --version N | --file PATH | --bot NAME [--id ID] [--pin]``,
``pin ID``, ``unpin ID``, ``retire ID``, ``export PATH``, ``import PATH``, ``plot [--out PNG]``,
``rate [--version N] [--games N] [MEMBER …]``. A member is named by its id, a version number or a
bot name without ``bot:``. Every change is one atomic pool commit (snapshot weights are written
before the commit that references them), so a command that fails half-way loses nothing.
"""

from __future__ import annotations

import argparse
import os
import stat
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rapid.errors import FormatError, UsageError
from rapid.formats import codec
from rapid.formats.params import LIMITS as PARAMS_LIMITS
from rapid.formats.params import decode_params
from rapid.infra.store import KeyNotFound, Store
from rapid.league.pool import League
from rapid.league.ratings import rate_games, rating_of
from rapid.league.state import (
    VERSION_ID,
    Member,
    PoolFormatError,
    PoolMissing,
    PoolState,
    SnapshotConflict,
    add_member,
    bot_ids,
    check_member_id,
    dump_pool,
    ensure_bots,
    foreign_id,
    load_pool,
    set_flag,
    version_id,
)
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import params_key, parse_version_text, snapshot_key

EXPORT_FORMAT = "rapid.league_export"
EXPORT_VERSION = 1
EXPORT_LIMITS = codec.Limits(max_bytes=8 << 30, max_array_bytes=4 << 30, max_elements=100_000)

PlayMatch = Callable[[str, str, int], tuple[int, int, int]]
"""``play_match(member_a, member_b, games) -> (wins_a, wins_b, draws)``, injected by the CLI owner."""


def build_parser(subparsers) -> list[argparse.ArgumentParser]:
    """Adds ``league`` to ``subparsers``; returns its commands' parsers (the caller adds its store options)."""
    p = subparsers.add_parser("league", help="inspect and manage the opponent pool")
    sub = p.add_subparsers(dest="league_cmd", metavar="COMMAND", required=True)
    ls = sub.add_parser("ls", help="list pool members with quality, rating and win rate")
    ls.add_argument("--all", action="store_true", help="also list retired members")
    add = sub.add_parser("add", help="add a snapshot (from a params version or file) or a scripted bot")
    src = add.add_mutually_exclusive_group(required=True)
    src.add_argument("--version", type=int, help="a params version published in this run")
    src.add_argument("--file", type=Path, help="a params file (.rpm), e.g. from another run")
    src.add_argument("--bot", help="a scripted bot, e.g. random or lane")
    add.add_argument("--id", help="member id (default: v<version> for snapshots)")
    add.add_argument("--pin", action="store_true", help="pin it: never retired")
    for name, text in (("pin", "never retire a member"), ("unpin", "allow retiring a member again"),
                       ("retire", "stop sampling a member (it stays listed with --all)")):
        sub.add_parser(name, help=text).add_argument("member")
    exp = sub.add_parser("export", help="write the pool and its snapshots' weights to one file")
    exp.add_argument("path", type=Path)
    imp = sub.add_parser("import", help="add the members of an exported file to this run's pool")
    imp.add_argument("path", type=Path)
    plot = sub.add_parser("plot", help="plot the rating of each version over time to a PNG")
    plot.add_argument("--out", type=Path, default=Path("league-ratings.png"))
    rate = sub.add_parser("rate", help="play evaluation games now and update TrueSkill ratings")
    rate.add_argument("--version", type=int, help="learner version to rate (default: latest)")
    rate.add_argument("--games", type=int, default=10, help="games against each opponent")
    rate.add_argument("members", nargs="*", help="opponents (default: every active member)")
    return list(sub.choices.values())


def run(args: argparse.Namespace, store: Store, play_match: PlayMatch | None = None) -> int:
    league = League(store)
    command = args.league_cmd
    if command == "rate":
        if play_match is None:
            raise UsageError("rapid league rate needs the evaluation code, which is not available here")
        return run_rate(args, store, play_match)
    handlers = {"ls": _ls, "add": _add, "pin": _pin, "unpin": _pin, "retire": _retire,
                "export": _export, "import": _import, "plot": _plot}
    try:
        return handlers[command](args, league)
    except PoolFormatError as e:
        raise UsageError(f"the league pool is damaged: {e}") from e


def _read(league: League) -> PoolState:
    try:
        return league.read()
    except PoolMissing:
        raise UsageError(f"no league pool in {league.store.describe()} (start a training run with a "
                         "league, or `rapid league add`)") from None


def resolve(state: PoolState, name: str) -> str:
    """A member id from an id, a version number or a bot name; UsageError if there is none."""
    version = parse_version_text(name)
    for candidate in (name, None if version is None else version_id(version), f"bot:{name}"):
        if candidate in state.members:
            return candidate
    raise UsageError(f"unknown league member {name!r} (see `rapid league ls --all`)")


def _fmt_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _ls(args, league: League) -> int:
    state = _read(league)
    rows = [["MEMBER", "KIND", "VERSION", "QUALITY", "RATING", "GAMES", "LEARNER WIN%", "PINNED"]]
    for m in state.members.values():
        if m.retired and not args.all:
            continue
        r = rating_of(state, m.id)
        win = m.learner_win_rate()
        rows.append([m.id + (" (retired)" if m.retired else ""), m.kind,
                     "-" if m.version is None else str(m.version), f"{m.quality:.3f}",
                     f"{r.mu:.1f} ± {r.sigma:.1f}", str(m.games),
                     "-" if win is None else f"{100 * win:.1f}", "yes" if m.pinned else ""])
    print(_fmt_table(rows))
    print(f"{len(rows) - 1} members; {state.latest_games} games against the latest policy; "
          f"pool revision {state.revision}")
    return 0


def _add(args, league: League) -> int:
    if args.bot:
        bot = bot_ids([args.bot])[0]
        try:
            check_member_id(bot, "bot")
        except ValueError as e:
            raise UsageError(str(e)) from None
        pin = args.pin
        league.update(lambda s: set_flag(ensure_bots(s, [bot], league.clock()), bot, pinned=pin or None))
        print(f"added {bot}")
        return 0
    if args.version is not None:
        if args.version < 0:
            raise UsageError(f"--version must be a published version (≥ 0), got {args.version}")
        try:
            blob = league.store.get(params_key(args.version))
        except KeyNotFound:
            raise UsageError(f"params version {args.version} is not in {league.store.describe()}") from None
        source = f"params version {args.version}"
    else:
        blob = read_file(args.file, PARAMS_LIMITS.max_bytes)
        source = str(args.file)
    try:
        obj = decode_params(blob)
    except FormatError as e:
        raise UsageError(f"{source} is not a valid rapid params object: {e}") from e
    member_id, note = args.id, ""
    if member_id is None and not league.is_learner_version(version_id(obj.version), obj):
        member_id = foreign_id(version_id(obj.version), blob)  # weights from elsewhere never take a v… id
        note = f"; not this run's version {obj.version}, so renamed"
    try:
        member = league.add_snapshot_bytes(blob, member_id=member_id, pinned=args.pin)
    except PoolFormatError:
        raise
    except SnapshotConflict as e:
        raise UsageError(f"{e}; choose another --id") from None
    except ValueError as e:  # an invalid --id
        raise UsageError(str(e)) from None
    print(f"added {member.id} (version {member.version}, quality {member.quality:.3f}){note}")
    return 0


def _pin(args, league: League) -> int:
    member = resolve(_read(league), args.member)
    league.update(lambda s: set_flag(s, member, pinned=args.league_cmd == "pin"))
    print(f"{args.league_cmd}ned {member}")
    return 0


def _retire(args, league: League) -> int:
    member = resolve(_read(league), args.member)
    try:
        league.update(lambda s: set_flag(s, member, retired=True))
    except ValueError as e:  # pinned
        raise UsageError(str(e)) from None
    print(f"retired {member}")
    return 0


def _export(args, league: League) -> int:
    state = _read(league)
    snapshots = {m.id: league.snapshot_bytes(m.id) for m in state.members.values() if m.kind == "snapshot"}
    data = codec.encode(EXPORT_FORMAT, EXPORT_VERSION, {"pool": dump_pool(state), "snapshots": snapshots})
    tmp = args.path.with_name(args.path.name + ".part")
    try:
        tmp.write_bytes(data)
        tmp.replace(args.path)  # a failed export never leaves a truncated file under the real name
    except OSError as e:
        raise UsageError(f"cannot write {args.path}: {e.strerror}") from e
    print(f"exported {len(state.members)} members ({len(snapshots)} snapshots) to {args.path}")
    return 0


def read_file(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them; UsageError for anything else (a FIFO, a device
    such as /dev/zero, a folder, a file over the limit) before reading more than the limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # non-blocking: opening a FIFO must not hang
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"cannot read {path}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_size > limit:
            raise UsageError(f"cannot read {path}: {info.st_size} bytes, limit {limit}")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}") from None
    if len(data) > limit:
        raise UsageError(f"cannot read {path}: over {limit} bytes")
    return data


def _read_export(path: Path) -> tuple[PoolState, dict[str, bytes]]:
    try:
        tree = codec.decode(read_file(path, EXPORT_LIMITS.max_bytes), EXPORT_FORMAT, (EXPORT_VERSION,),
                            EXPORT_LIMITS)
        pool = load_pool(codec.require(tree, "pool", bytes, "league export"), f"{path} pool")
        snapshots = codec.require(tree, "snapshots", dict, "league export")
        for m in pool.members.values():
            if m.kind == "snapshot":
                decode_params(codec.require(snapshots, m.id, bytes, "league export snapshots"))
    except FormatError as e:
        raise UsageError(f"{path} is not a valid league export: {e}") from e
    return pool, snapshots


def _import(args, league: League) -> int:
    """Members of another run's export join this pool. Nothing is written until every member is checked,
    and a failed commit removes the snapshots it wrote. Renamed: another run's ``v…`` snapshots (those ids
    name this run's learner versions). Refused: an id this pool holds with other weights."""
    pool, snapshots = _read_export(args.path)
    existing = league.read_or_empty().members
    renamed: dict[str, str] = {}
    new: list[Member] = []
    for m in pool.members.values():
        target = m.id
        if m.kind == "snapshot":
            blob = snapshots[m.id]
            if VERSION_ID.match(m.id) and not league.is_learner_version(m.id, decode_params(blob)):
                target = renamed[m.id] = foreign_id(m.id, blob)
            if target in existing or league.store.exists(snapshot_key(target)):
                if league.snapshot_bytes(target) != blob:
                    raise UsageError(f"this run already holds different weights under {target}; nothing imported")
        if target not in existing:
            new.append(replace(m, id=target))
    renamed = {a: b for a, b in renamed.items() if b in {m.id for m in new}}
    written = []
    try:
        for m in (m for m in new if m.kind == "snapshot"):
            if league.store.put_if_absent(snapshot_key(m.id), snapshots[_source(m.id, renamed)]):
                written.append(snapshot_key(m.id))
        if new:
            league.update(lambda state: _merge(state, pool, new, renamed))
    except BaseException:
        for key in written:  # no snapshot without the member that references it
            league.store.delete(key)
        raise
    skipped = len(pool.members) - len(new)
    print(f"imported {len(new)} members" + (f"; skipped {skipped} already in the pool" if skipped else "")
          + "".join(f"; renamed {a} to {b}" for a, b in renamed.items()))
    return 0


def _source(member_id: str, renamed: dict[str, str]) -> str:
    return next((a for a, b in renamed.items() if b == member_id), member_id)


def _merge(state: PoolState, pool: PoolState, new: list[Member], renamed: dict[str, str]) -> PoolState:
    for m in new:
        state = add_member(state, m)
        source = _source(m.id, renamed)
        if source in pool.ratings and m.id not in state.ratings:
            state.ratings[m.id] = pool.ratings[source]
    ids = {_source(m.id, renamed): m.id for m in new}
    points = [replace(p, id=ids[p.id]) for p in pool.history if p.id in ids]
    state.history = sorted(state.history + points, key=lambda p: p.time)
    return state


def _plot(args, league: League) -> int:
    state = _read(league)
    if not state.history:
        raise UsageError("no ratings yet: run evaluation games first (`rapid league rate`)")
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    fig, (over_time, by_version) = plt.subplots(1, 2, figsize=(12, 4.5))
    series: dict[str, list] = {}
    for p in state.history:
        series.setdefault(p.id, []).append(p)
    t0 = state.history[0].time
    for rated_id, points in series.items():
        over_time.plot([(p.time - t0) / 60 for p in points], [p.mu for p in points], marker=".",
                       label=rated_id if len(series) <= 12 else None)
    over_time.set(xlabel="minutes", ylabel="TrueSkill μ", title="rating of each version over time")
    if len(series) <= 12:
        over_time.legend(fontsize="small")
    versions = sorted((int(m.group(1)), rating_of(state, i)) for i in series if (m := VERSION_ID.match(i)))
    if versions:
        by_version.errorbar([v for v, _ in versions], [r.mu for _, r in versions],
                            yerr=[r.sigma for _, r in versions], fmt="o-", capsize=3)
    by_version.set(xlabel="learner version", ylabel="TrueSkill μ ± σ", title="current rating by version")
    fig.tight_layout()
    try:
        fig.savefig(args.out, dpi=120)
    except OSError as e:
        raise UsageError(f"cannot write {args.out}: {e.strerror}") from e
    finally:
        plt.close(fig)
    print(f"wrote {args.out}")
    return 0


def run_rate(args: argparse.Namespace, store: Store, play_match: PlayMatch) -> int:
    """Play ``args.games`` games of a learner version against each opponent and commit the ratings.

    Each opponent's result is committed on its own, so an interrupted run keeps the finished ones.
    """
    league = League(store)
    state = _read(league)
    version = args.version if args.version is not None else ParameterStore(store).latest_version()
    if version is None:
        raise UsageError("no params version published yet: nothing to rate")
    if args.games < 1:
        raise UsageError("--games must be at least 1")
    learner = version_id(version)
    opponents = ([resolve(state, name) for name in args.members] if args.members
                 else [m.id for m in state.members.values() if m.active and m.id != learner])
    if not opponents:
        raise UsageError("no opponents to rate against: the pool has no active members")
    for opponent in opponents:
        wins_a, wins_b, draws = play_match(learner, opponent, args.games)
        state = league.update(lambda s: rate_games(s, learner, opponent, wins_a, wins_b, draws, time.time()))
        r = rating_of(state, learner)
        print(f"{learner} vs {opponent}: {wins_a}-{wins_b}-{draws} (W-L-D); "
              f"{learner} now {r.mu:.1f} ± {r.sigma:.1f}")
    return 0
