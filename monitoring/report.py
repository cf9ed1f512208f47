r"""Static end-of-run report for people without Grafana: PNG plots from a run's own JSON-lines logs.

Usage::

    >>> import json, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> run_dir = Path(tmp.name)
    >>> (run_dir / "logs").mkdir()
    >>> rows = [{"time": t, "update": t, "version": t, "samples_per_s": 100.0 + t} for t in range(5)]
    >>> _ = (run_dir / "logs" / "optimizer.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    >>> [p.name for p in write_report(run_dir, run_dir / "report")]   # plots of what the logs hold, and an index
    ['throughput.png', 'report.md']
    >>> tmp.cleanup()

Reads ``<run_dir>/logs/optimizer.jsonl`` (one object per update: time, update, version, samples_per_s,
policy_loss, value_loss, entropy, approx_kl, clip_fraction, explained_variance, staleness_mean, sample_reuse,
grad_norm, lr) and ``<run_dir>/logs/eval.jsonl`` (time, version, opponent, games, win_rate, and optionally
greedy, rating / rating_sigma). A plot whose file or keys are missing is skipped with a note in ``report.md``; a
truncated last line (the run is still writing) is ignored. Plots use the Agg backend: no display needed.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

import matplotlib

from rapid.monitoring.logs import read_jsonl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

# (file stem, title, [(key, label), ...]); a panel per key keeps different scales readable.
OPTIMIZER_PLOTS = (
    ("throughput", "Throughput", [("samples_per_s", "samples / s")]),
    ("losses", "Learning", [("policy_loss", "policy loss"), ("value_loss", "value loss"), ("entropy", "entropy"),
                            ("approx_kl", "approx KL"), ("clip_fraction", "clip fraction"),
                            ("explained_variance", "explained variance"), ("grad_norm", "grad norm"),
                            ("lr", "learning rate")]),
    ("staleness_reuse", "Staleness and reuse", [("staleness_mean", "mean staleness (versions)"),
                                                ("sample_reuse", "sample reuse")]),
)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _series(rows: list[dict], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for row in rows:
        x, y = _number(row.get(x_key)), _number(row.get(y_key))
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def _x_axis(rows: list[dict]) -> tuple[str, str, float]:
    """Plot against minutes since the first row when times exist, else against the update/version index."""
    times = [t for t in (_number(r.get("time")) for r in rows) if t is not None]
    if times:
        return "time", "minutes since start", min(times)
    key = "update" if any("update" in r for r in rows) else "version"
    return key, key, 0.0


def _plot_panels(path: Path, title: str, rows: list[dict], keys: list[tuple[str, str]], notes: list[str]) -> bool:
    x_key, x_label, x0 = _x_axis(rows)
    scale = 60.0 if x_key == "time" else 1.0
    panels = []
    for key, label in keys:
        xs, ys = _series(rows, x_key, key)
        if xs:
            panels.append(([(x - x0) / scale for x in xs], ys, label))
        else:
            notes.append(f"{path.stem}: no values for '{key}'")
    if not panels:
        return False
    cols = 2 if len(panels) > 1 else 1
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 2.6 * nrows + 0.6), squeeze=False)
    for ax, (xs, ys, label) in zip(axes.flat, panels):
        ax.plot(xs, ys, linewidth=1)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel(x_label, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def win_rate_lines(rows: list[dict]) -> dict[str, list[dict]]:
    """Evaluation records by the line of the win-rate plot they belong to: one per opponent, and the greedy
    evaluations (``eval.play``) a line of their own beside the sampled ones.

    >>> sorted(win_rate_lines([{"opponent": "random"}, {"opponent": "random", "greedy": True}, {"opponent": "p"}]))
    ['p', 'random', 'random (greedy)']
    """
    lines: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        lines[str(row.get("opponent", "all")) + (" (greedy)" if row.get("greedy") else "")].append(row)
    return lines


def _plot_league(path: Path, rows: list[dict], notes: list[str]) -> bool:
    x_key, x_label, x0 = _x_axis(rows)
    scale = 60.0 if x_key == "time" else 1.0
    by_opponent = win_rate_lines(rows)
    has_rating = any(_number(r.get("rating")) is not None for r in rows)
    fig, axes = plt.subplots(1, 2 if has_rating else 1, figsize=(12 if has_rating else 6, 3.6), squeeze=False)
    plotted = False
    for opponent, opp_rows in sorted(by_opponent.items()):
        xs, ys = _series(opp_rows, x_key, "win_rate")
        if xs:
            axes[0, 0].plot([(x - x0) / scale for x in xs], ys, marker=".", linewidth=1, label=opponent)
            plotted = True
    if not plotted:
        plt.close(fig)
        notes.append(f"{path.stem}: no values for 'win_rate'")
        return False
    axes[0, 0].set(title="win rate", xlabel=x_label, ylim=(-0.02, 1.02))
    axes[0, 0].legend(fontsize=8)
    if has_rating:
        xs, mu = _series(rows, x_key, "rating")
        xs = [(x - x0) / scale for x in xs]
        ax = axes[0, 1]
        ax.plot(xs, mu, linewidth=1, label="mu")
        _, sigma = _series(rows, x_key, "rating_sigma")
        if len(sigma) == len(mu):
            ax.fill_between(xs, [m - s for m, s in zip(mu, sigma)], [m + s for m, s in zip(mu, sigma)], alpha=0.2)
        ax.set(title="rating", xlabel=x_label)
    return _finish(fig, axes, "League", path)


def _plot_ladder(path: Path, rows: list[dict]) -> bool:
    """The strength ladder's rating (± its standard error) and the win rate against each rung, by time or version."""
    rows = [r for r in rows if _number(r.get("ladder_rating")) is not None]
    if not rows:
        return False
    x_key, x_label, x0 = _x_axis(rows)
    scale = 60.0 if x_key == "time" else 1.0
    xs = [(float(r[x_key]) - x0) / scale for r in rows]
    mu = [float(r["ladder_rating"]) for r in rows]
    sigma = [float(r.get("ladder_sigma", 0.0)) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), squeeze=False)
    axes[0, 0].plot(xs, mu, marker=".", linewidth=1)
    axes[0, 0].fill_between(xs, [m - s for m, s in zip(mu, sigma)], [m + s for m, s in zip(mu, sigma)], alpha=0.2)
    axes[0, 0].set(title="ladder rating (random = 0)", xlabel=x_label)
    for rung in sorted({k for r in rows for k in r.get("ladder", {})}):
        points = [(x, r["ladder"][rung].get("win_rate")) for x, r in zip(xs, rows) if rung in r.get("ladder", {})]
        axes[0, 1].plot([x for x, _ in points], [y for _, y in points], marker=".", linewidth=1, label=rung)
    axes[0, 1].set(title="win rate against each rung", xlabel=x_label, ylim=(-0.02, 1.02))
    axes[0, 1].legend(fontsize=8)
    return _finish(fig, axes, "Strength ladder (opponents training never meets)", path)


def _finish(fig, axes, title: str, path: Path) -> bool:
    """Grid every panel, title the figure, write it to ``path`` and close it."""
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_report(run_dir: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """Write the PNG plots and a ``report.md`` index (with notes on skipped plots); returns the files written."""
    logs = Path(run_dir) / "logs"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    notes: list[str] = []

    opt_path = logs / "optimizer.jsonl"
    opt_rows = read_jsonl(opt_path) if opt_path.is_file() else []
    if not opt_rows:
        notes.append(f"no optimizer log records in {opt_path}: skipped throughput, losses, staleness/reuse")
    else:
        for stem, title, keys in OPTIMIZER_PLOTS:
            if _plot_panels(out / f"{stem}.png", title, opt_rows, keys, notes):
                written.append(out / f"{stem}.png")

    eval_path = logs / "eval.jsonl"
    eval_rows = read_jsonl(eval_path) if eval_path.is_file() else []
    if not eval_rows:
        notes.append(f"no evaluation records in {eval_path}: skipped win rate")
    elif _plot_league(out / "win_rate.png", eval_rows, notes):
        written.append(out / "win_rate.png")
    if _plot_ladder(out / "ladder.png", eval_rows):
        written.append(out / "ladder.png")

    lines = [f"# rapid report: {Path(run_dir).name}", ""]
    lines += [f"![{p.stem}]({p.name})" for p in written]
    if notes:
        lines += ["", "## Skipped", ""] + [f"- {n}" for n in notes]
    index = out / "report.md"
    index.write_text("\n".join(lines) + "\n")
    written.append(index)
    return written
