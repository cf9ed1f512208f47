"""Top-down pictures of a moba game and animated GIFs of a match (Pillow, no window needed).

Side 0 is blue and attacks to the right, side 1 is red. Towers are squares, ancients big squares, creeps
small dots, heroes circles with an HP bar (green) and a mana bar (blue); the top line shows game time,
kills and destroyed structures.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

from rapid.envs.moba.config import ANCIENT

if TYPE_CHECKING:
    from rapid.envs.moba.env import MobaVecEnv

SCALE = 6.0
"""Pixels per map unit."""
HEADER = 16
MARGIN = 3.0
"""Map units of ground drawn beyond each end, so heroes at the fountain stay in the picture."""
COLORS = {
    "ground": (34, 60, 34), "lane": (110, 96, 70), "text": (235, 235, 235), "dead": (70, 70, 70),
    "hp": (60, 200, 60), "mana": (70, 110, 230), "bar_bg": (20, 20, 20),
    0: (70, 130, 255), 1: (240, 70, 60), "creep0": (140, 180, 255), "creep1": (255, 150, 140),
}


def render_frame(env: MobaVecEnv, game: int = 0) -> np.ndarray:
    """RGB uint8 [height, width, 3] picture of game ``game`` of ``env`` as it is now."""
    cfg, lay, st = env.cfg, env.layout, env.state
    y_half = env.rules.y_limit + 3.0
    width = int((cfg.map_length + 2 * MARGIN) * SCALE) + 1
    height = int(2 * y_half * SCALE) + HEADER
    img = Image.new("RGB", (width, height), COLORS["ground"])
    draw = ImageDraw.Draw(img)

    def px(x: float, y: float) -> tuple[float, float]:
        return (x + MARGIN) * SCALE, HEADER + (y_half - y) * SCALE

    def bar(cx: float, top: float, w: float, frac: float, color: tuple[int, int, int]) -> None:
        draw.rectangle([cx - w / 2, top, cx + w / 2, top + 2], fill=COLORS["bar_bg"])
        draw.rectangle([cx - w / 2, top, cx - w / 2 + w * max(0.0, min(1.0, frac)), top + 2], fill=color)

    for ly in cfg.lane_y():
        _, top = px(0.0, float(ly) + 2.0)
        draw.rectangle([0, top, width, top + 4.0 * SCALE], fill=COLORS["lane"])

    x, y, hp, max_hp, alive = st.x[game], st.y[game], st.hp[game], st.max_hp[game], st.alive[game]
    for u in lay.structs:
        cx, cy = px(float(x[u]), float(y[u]))
        r = (2.4 if lay.kind[u] == ANCIENT else 1.5) * SCALE
        color = COLORS[int(lay.team[u])] if alive[u] else COLORS["dead"]
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=color, outline=(0, 0, 0))
        if alive[u]:
            bar(cx, cy - r - 4, 2 * r, float(hp[u] / max_hp[u]), COLORS["hp"])
    for u in lay.creeps[alive[lay.creeps]]:
        cx, cy = px(float(x[u]), float(y[u]))
        r = 0.8 * SCALE
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=COLORS[f"creep{int(lay.team[u])}"])
    for h in lay.heroes[alive[lay.heroes]]:
        cx, cy = px(float(x[h]), float(y[h]))
        r = 1.5 * SCALE
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=COLORS[int(lay.team[h])], outline=(255, 255, 255))
        bar(cx, cy - r - 7, 2 * r, float(hp[h] / max_hp[h]), COLORS["hp"])
        bar(cx, cy - r - 4, 2 * r, float(st.mana[game, h] / st.max_mana[game, h]), COLORS["mana"])
        draw.text((cx - 3, cy - 5), str(int(h % lay.n)), fill=(0, 0, 0))

    kills = st.kills[game].reshape(2, lay.n).sum(axis=1)
    seconds = float(st.step_count[game]) * cfg.seconds_per_step
    header = (f"t={seconds:5.1f}s   kills {int(kills[0])}-{int(kills[1])}   structures destroyed "
              f"{int(st.towers_destroyed[game, 0])}-{int(st.towers_destroyed[game, 1])}")
    draw.text((4, 2), header, fill=COLORS["text"])
    return np.asarray(img, dtype=np.uint8)


def annotate(frame: np.ndarray, text: str) -> np.ndarray:
    """A copy of ``frame`` with ``text`` written in the middle (end-of-match caption)."""
    img = Image.fromarray(np.asarray(frame, dtype=np.uint8))
    draw = ImageDraw.Draw(img)
    w, h = img.size
    draw.rectangle([w // 2 - 60, h // 2 - 10, w // 2 + 60, h // 2 + 10], fill=(0, 0, 0))
    draw.text((w // 2 - 50, h // 2 - 6), text, fill=COLORS["text"])
    return np.asarray(img, dtype=np.uint8)


def write_gif(frames: Sequence[np.ndarray], path: str | Path, fps: float = 10.0) -> Path:
    """Write RGB frames as a looping animated GIF; returns the path."""
    if not frames:
        raise ValueError("write_gif: no frames")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(round(1000 / fps)), loop=0,
                   optimize=False)
    return path
