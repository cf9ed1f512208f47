"""What a population looks like, read from its store: the table of `rapid pbt ls` (and of `rapid train --pbt`'s
summary) and the plots of each member's rating and hyperparameters over the rounds (`rapid pbt plot`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rapid.errors import UsageError
from rapid.infra.store import StoreError
from rapid.league.population import Fitness, Population, Round
from rapid.run.param_store import ParameterStore
from rapid.run.population import PopulationStore, hparams_now


@dataclass
class MemberRow:
    member: int
    version: int | None
    """The member's newest published version."""
    fitness: Fitness | None
    hparams: dict[str, float]
    lineage: list[tuple[int, int]]
    """(round, leader) of every copy it made, oldest first."""


def member_rows(pops: PopulationStore, pop: Population, rounds: list[Round]) -> list[MemberRow]:
    now = hparams_now(pop, rounds)
    rows = []
    for m in range(pop.members):
        try:
            version = ParameterStore(pops.member_store(m)).latest_version()
        except (StoreError, ValueError):
            version = None
        lineage = [(r.round, mv.leader) for r in rounds for mv in r.moves if mv.member == m]
        rows.append(MemberRow(m, version, pops.fitness(m), now[m], lineage))
    return rows


def read_population(pops: PopulationStore) -> tuple[Population, list[Round]]:
    pop = pops.population()
    if pop is None:
        raise UsageError(f"{pops.root.describe()} holds no population (pbt/population.json): start one with "
                         "`rapid train --pbt N`")
    return pop, pops.rounds(pop)


def table(pops: PopulationStore, now: float | None = None) -> str:
    """The population as a table: each member's newest version, rating ± σ (of which version), hyperparameters
    and lineage; then the rounds so far."""
    pop, rounds = read_population(pops)
    now = time.time() if now is None else now
    names = sorted(pop.search)
    head = ["member", "version", "rating", "rated", *names, "lineage"]
    body = []
    for row in member_rows(pops, pop, rounds):
        f = row.fitness
        body.append([f"m{row.member}", "-" if row.version is None else f"v{row.version}",
                     "-" if f is None else f"{f.rating:.0f} ± {f.sigma:.0f}", "-" if f is None else f"v{f.version}",
                     *(f"{row.hparams[k]:.3g}" for k in names),
                     " ".join(f"r{r}←m{w}" for r, w in row.lineage) or "-"])
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *body]]
    moves = sum(len(r.moves) for r in rounds)
    due = pop.round_at(now) + 1
    lines.append(f"{len(rounds)} round(s) decided, {moves} copy(ies); next round (r{due}) in "
                 f"{max(0.0, pop.start + due * pop.interval_s - now) / 60:.1f} min")
    return "\n".join(lines)


def plot(pops: PopulationStore, out: Path) -> Path:
    """Each member's rating (as each round saw it) and each searched hyperparameter, by round."""
    pop, rounds = read_population(pops)
    if not rounds:
        raise UsageError("no round decided yet: nothing to plot")
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    names = sorted(pop.search)
    fig, axes = plt.subplots(1, 1 + len(names), figsize=(5 * (1 + len(names)), 4), squeeze=False)
    minutes = [(r.time - pop.start) / 60 for r in rounds]
    for m in range(pop.members):
        ratings = [(t, f.rating) for t, r in zip(minutes, rounds) if (f := r.fitness.get(m)) is not None]
        axes[0][0].plot([t for t, _ in ratings], [v for _, v in ratings], marker="o", label=f"m{m}")
        for ax, name in zip(axes[0][1:], names):
            ax.step([0.0, *minutes], [pop.initial[m][name], *(r.hparams[m][name] for r in rounds)], where="post",
                    label=f"m{m}")
    axes[0][0].set(xlabel="minutes", ylabel="ladder rating (Elo)", title="fitness at each round")
    for ax, name in zip(axes[0][1:], names):
        ax.set(xlabel="minutes", ylabel=name, title=f"ppo.{name}", yscale="log")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror}") from e
    finally:
        plt.close(fig)
    return out
