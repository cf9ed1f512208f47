"""Why a moba policy plays differently greedy and sampled: win rate against a bot, where its heroes go and what
they do, in the same games played both ways.

Run on a trained moba run (the evaluator's baseline by default)::

    python benchmarks/bench_moba_greedy.py --run-dir runs/moba-5v5 [--version latest] [--games 64]

For each mode (sampled as trained, greedy as ``rapid eval --greedy``) it plays ``--games`` games of the version
against the bot through rapid's own match (:func:`rapid.run.matches.play_match`, half on each side) and prints a
markdown table:

- the win rate and the wins before the time limit;
- the share of the policy's alive hero-steps spent in a lane (past the own inner tower: nearer its base every
  hero starts in the middle), and how those lane-steps split over the lanes (a hero's lane: the nearest one);
- ``roles``: in how many distinct lanes a game's heroes mostly were (1: the whole team in one lane; 3 with three
  lanes and heroes split over them), averaged over games;
- ``index→lane``: how much a hero's lane depends on its index in its team (the mutual information between the
  index and the lane, over the lane's entropy: 0, every index goes the same way; 1, the index fixes the lane);
- ``own lane early``: the share of alive hero-steps in the first ``lane_phase_s`` seconds of a game (the moba option
  that ``reward_off_lane`` charges in, 120 s by default) spent nearest the hero's own lane (hero i: lane i mod
  lanes, where the ``lane`` bot sends it);
- the share of each action type, deaths and structures destroyed per game, per side.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

import numpy as np

from rapid.api import run_dir_config
from rapid.envs.base import EpisodeStats, StepResult
from rapid.envs.moba.config import NUM_TYPES
from rapid.envs.registry import make_env
from rapid.roles.startup import open_run_store
from rapid.run.matches import batch_size, make_player, play_match, resolve_version
from rapid.run.param_store import ParameterStore

LANE_NAMES = ("mid", "top", "bottom")  # the order of MobaConfig.lane_y
TYPE_NAMES = ("noop", "move", "attack", "nuke", "stun", "heal")


@dataclass
class Tally:
    """What the policy's heroes did over a match, filled by the match's watch and episode callbacks."""

    lanes: int
    heroes: int
    games: list[np.ndarray] = field(default_factory=list)
    """Per finished game, [hero index in team, lane]: alive hero-steps in a lane (past the own inner tower)."""
    alive_steps: int = 0
    early_steps: int = 0
    """Alive hero-steps in the first ``lane_phase_s`` seconds of a game…"""
    early_own_lane: int = 0
    """…and those of them nearest the hero's own lane."""
    type_steps: np.ndarray = field(default_factory=lambda: np.zeros(NUM_TYPES))
    deaths: list[float] = field(default_factory=list)
    enemy_deaths: list[float] = field(default_factory=list)
    destroyed: list[float] = field(default_factory=list)
    lost: list[float] = field(default_factory=list)

    @property
    def lane_steps(self) -> np.ndarray:
        """[games, hero index in team, lane]."""
        return np.stack(self.games) if self.games else np.zeros((0, self.heroes, self.lanes))


def tally_match(env, player, bot, games: int, seed: int) -> tuple[Tally, object]:
    """Plays the match and counts where ``player``'s heroes stood and what they did."""
    cfg, lay = env.cfg, env.layout
    n, H = cfg.heroes_per_side, lay.H
    lane_y = cfg.lane_y()
    tally = Tally(cfg.lanes, n)
    current = np.zeros((env.num_games, n, cfg.lanes))

    own_edge = np.where(lay.hero_side == 0, 0.0, cfg.map_length)
    index = np.arange(H) % n  # each hero's index in its team

    def watch(step: StepResult, rows: np.ndarray, actions: np.ndarray) -> None:
        st = env.state
        alive = st.alive[:, :H] & rows
        # In a lane: past the own inner tower (heroes start in the middle by their base); the nearest lane.
        out = alive & (np.abs(st.x[:, :H] - own_edge) > cfg.tower_x[1])
        lane = np.abs(st.y[:, :H, None] - lane_y).argmin(-1)  # [B, H]
        for h in range(H):
            g = np.flatnonzero(out[:, h])
            np.add.at(current, (g, index[h], lane[g, h]), 1.0)
        tally.alive_steps += int(alive.sum())
        early = alive & cfg.in_lane_phase(st.step_count)[:, None]
        tally.early_steps += int(early.sum())
        tally.early_own_lane += int((early & ~lay.away_from_own_lane(st.y[:, :H])).sum())
        np.add.at(tally.type_steps, actions[..., 0][alive], 1.0)

    def on_episode(ep: EpisodeStats, side_a: int) -> None:
        tally.games.append(current[ep.game].copy())
        current[ep.game] = 0.0
        own, other = side_a, 1 - side_a
        for key, out, side in (("deaths", tally.deaths, own), ("deaths", tally.enemy_deaths, other),
                               ("towers_destroyed", tally.lost, other), ("towers_destroyed", tally.destroyed, own)):
            out.append(ep.info[f"{key}_{side}"])

    score = play_match(env, player, bot, games, seed=seed, watch=watch, on_episode=on_episode)
    return tally, score


def index_lane_information(lane_steps: np.ndarray) -> float:
    """I(index; lane) / H(lane) over all hero-steps: how much a hero's index in its team decides its lane."""
    joint = lane_steps.sum(0)
    total = joint.sum()
    if total == 0:
        return float("nan")
    p = joint / total
    pi, pl = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
    nz = p > 0
    mutual = float((p[nz] * np.log(p[nz] / (pi @ pl)[nz])).sum())
    entropy = float(-(pl[pl > 0] * np.log(pl[pl > 0])).sum())
    return mutual / entropy if entropy > 0 else 0.0


def mean_text(values: list[float]) -> str:
    return f"{np.mean(values):.1f}" if values else "–"


def row(mode: str, tally: Tally, score) -> str:
    steps = tally.lane_steps
    lanes = steps.sum((0, 1))
    lane_share = lanes / max(lanes.sum(), 1.0)
    # A hero's main lane per game (heroes that reached a lane); distinct main lanes of a team per game.
    roles = float(np.mean([len(set(game.argmax(-1)[game.sum(-1) > 0])) for game in steps]))
    in_lane = lanes.sum() / max(tally.alive_steps, 1)
    types = tally.type_steps / max(tally.type_steps.sum(), 1.0)
    return (f"| {mode} | {score.win_rate:.1%} ({score.wins_before_limit} before the limit) | {in_lane:.1%} | "
            + " / ".join(f"{s:.1%}" for s in lane_share) + f" | {roles:.2f} | "
            + f"{index_lane_information(steps):.2f} | {tally.early_own_lane / max(tally.early_steps, 1):.1%} | "
            + " / ".join(f"{t:.1%}" for t in types)
            + f" | {mean_text(tally.deaths)} : {mean_text(tally.enemy_deaths)} | "
            + f"{mean_text(tally.destroyed)} : {mean_text(tally.lost)} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, help="a moba run's directory")
    p.add_argument("--version", default="latest", help="the version to play (latest, 12 or v12)")
    p.add_argument("--against", default=None, help="the bot to play (default: the run's eval.opponent)")
    p.add_argument("--games", type=int, default=64, help="games per mode (half on each side)")
    p.add_argument("--seed", type=int, default=9001)
    args = p.parse_args(argv)
    cfg = run_dir_config(args.run_dir, [])
    if cfg.env.name != "moba":
        print(f"bench_moba_greedy: {args.run_dir} is a {cfg.env.name} run, not moba", file=sys.stderr)
        return 2
    params = ParameterStore(open_run_store(cfg))
    against = args.against or cfg.eval.opponent
    lane_names = LANE_NAMES[: int(cfg.env.options.get("lanes", 1))]
    print(f"| mode | win rate vs {against} | in a lane | lane-steps ({' / '.join(lane_names)}) | roles | index→lane "
          f"| own lane early | action types ({' / '.join(TYPE_NAMES)}) | deaths (own : enemy) "
          "| structures (destroyed : lost) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    version = str(resolve_version(params, args.version))  # both modes play the same version of a live run
    for mode in ("sampled", "greedy"):
        env = make_env(cfg.env.name, num_games=batch_size(args.games), seed=args.seed, options=cfg.env.options)
        player = make_player(version, cfg, env, params, seed=args.seed, greedy=mode == "greedy")
        bot = make_player(against, cfg, env, params, seed=args.seed + 1)
        tally, score = tally_match(env, player, bot, args.games, args.seed)
        print(row(f"{player.name} {mode}", tally, score), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
