"""Play one moba match between two players and write it as an animated GIF (``rapid replay``).

A player is a scripted bot name of the env (``"lane"``, ``"idle"``, ``"random"``) or a player of the match
library (:class:`rapid.run.matches.Player`: a :class:`~rapid.envs.base.ScriptedBot`, or the policy player the CLI
builds from a params version or snapshot). Player 0 plays side 0, player 1 side 1.

>>> import tempfile
>>> tmp = tempfile.TemporaryDirectory()
>>> out = Path(tmp.name) / "lane-vs-idle.gif"
>>> write_replay({"heroes_per_side": 1}, ["lane", "idle"], out, max_steps=4) is None   # cut before the game ended
True
>>> out.read_bytes()[:6]
b'GIF89a'
>>> tmp.cleanup()
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rapid.envs.base import EpisodeStats
from rapid.envs.moba import MobaVecEnv
from rapid.envs.moba.render import annotate, render_frame, write_gif

if TYPE_CHECKING:  # the match library's player; importing it for real would import torch
    from rapid.run.matches import Player


def write_replay(env_options: dict, players: Sequence[str | Player], out_path: str | Path, seed: int = 0,
                 max_steps: int | None = None, fps: float = 10.0, frame_every: int = 1) -> EpisodeStats | None:
    """Play one game of ``moba`` with ``env_options`` and write its GIF to ``out_path``.

    Stops when the game ends or after ``max_steps`` steps, whichever is first. Returns the game's
    EpisodeStats, or None when ``max_steps`` cut it first. Every ``frame_every``-th step becomes a frame.
    """
    if len(players) != 2:
        raise ValueError("write_replay: need exactly two players (side 0, side 1)")
    env = MobaVecEnv(num_games=1, seed=seed, **env_options)
    actors = [env.make_bot(p, seed + i) if isinstance(p, str) else p for i, p in enumerate(players)]
    side0 = (np.asarray(env.spec.side_of_agent) == 0)[None, :, None]
    limit = env.cfg.max_steps if max_steps is None else max_steps
    step = env.reset(seed=seed)
    frames = [render_frame(env, 0)]
    result: EpisodeStats | None = None
    for t in range(limit):
        actions = np.where(side0, actors[0].act(step), actors[1].act(step))
        step = env.step(actions)
        if step.episodes:  # the env has already reset this game: close with a caption on the last picture
            result = step.episodes[0]
            outcome = "draw" if result.winner < 0 else f"side {result.winner} wins"
            frames.extend([annotate(frames[-1], outcome)] * int(fps))
            break
        if (t + 1) % frame_every == 0:
            frames.append(render_frame(env, 0))
    write_gif(frames, out_path, fps=fps)
    return result
