"""How `rapid train` shares a machine's cores when ``run.num_workers`` is 0: one pure decision, checked with
injected machine facts (cores, a GPU, node inference) since CI has no GPU box.

The optimizer process keeps a core. On a GPU box the rest of the optimizer's side keeps one each too: its decode
processes (``optimizer.decode_workers``; the intake of a GPU learner is the host's work), the node's inference
server and the evaluator. Without them the rollout workers took every core (14 workers, the server, the optimizer,
its decoders and the evaluator on 16 vCPUs in the recorded H200 run) and the optimizer's intake fell behind what
they produced. A CPU-only machine keeps the old rule (every core but the optimizer's): there the learner is the
slow side and the pace (``optimizer.pace_rollouts``) holds the rollouts back instead.

    >>> print(plan_box(cores=16, gpu=True, node_inference=True, decoders=2, evaluator=True).line())
    11 rollout worker(s) on 16 cores, keeping 1 for the optimizer, 2 for its decode processes, 1 for the node ...
    >>> plan_box(cores=2, gpu=False, node_inference=False, decoders=1, evaluator=True).workers
    1
    >>> plan_box(cores=8, gpu=False, node_inference=False, decoders=1, evaluator=True).workers
    7

On a GPU box the kept cores are kept for real where the OS allows (Linux): each role's processes are pinned to
their cores (:func:`cpu_sets`), so the rollout workers cannot crowd the optimizer's side out; the optimizer's decode
processes inherit its cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BoxPlan:
    workers: int
    cores: int
    kept: tuple[tuple[str, int], ...]
    """(what, cores) kept off the rollout workers."""
    gpu: bool = False

    def line(self) -> str:
        kept = ", ".join(f"{n} for {what}" for what, n in self.kept if n)
        return f"{self.workers} rollout worker(s) on {self.cores} cores, keeping {kept}"


def plan_box(cores: int, gpu: bool, node_inference: bool, decoders: int, evaluator: bool) -> BoxPlan:
    """Rollout workers for a machine of ``cores`` usable cores; at least one."""
    kept = (("the optimizer", 1),
            ("its decode processes", decoders if gpu else 0),
            ("the node inference server", 1 if node_inference else 0),
            ("the evaluator", 1 if gpu and evaluator else 0))
    return BoxPlan(max(1, cores - sum(n for _, n in kept)), cores, kept, gpu)


def cpu_sets(plan: BoxPlan, cpus: Sequence[int]) -> dict[str, frozenset[int]] | None:
    """The cores each role's processes run on, from the cores this process may use (``cpus``): the optimizer and
    its decode processes, the node inference server and the evaluator on the cores kept for them, the rollout
    workers on the rest. None where nothing is pinned: not a GPU box (there the pace holds the rollouts back), or
    fewer cores than the plan (another process's affinity changed meanwhile).

    >>> plan = plan_box(cores=16, gpu=True, node_inference=True, decoders=2, evaluator=True)
    >>> {role: sorted(cores) for role, cores in cpu_sets(plan, range(16)).items()}
    {'optimizer': [0, 1, 2], 'inference': [3], 'evaluator': [4], 'rollout': [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]}
    >>> cpu_sets(plan_box(cores=8, gpu=False, node_inference=False, decoders=1, evaluator=True), range(8)) is None
    True
    """
    cpus = sorted(cpus)
    kept = dict(plan.kept)
    sizes = {"optimizer": kept["the optimizer"] + kept["its decode processes"],
             "inference": kept["the node inference server"], "evaluator": kept["the evaluator"]}
    if not plan.gpu or len(cpus) != plan.cores or sum(sizes.values()) >= len(cpus):
        return None
    sets, start = {}, 0
    for role, n in sizes.items():
        if n:
            sets[role], start = frozenset(cpus[start:start + n]), start + n
    sets["rollout"] = frozenset(cpus[start:])
    return sets


def describe(sets: dict[str, frozenset[int]]) -> str:
    """``sets`` as one line: 'optimizer 0-2, inference 3, …'.

    >>> describe({"optimizer": frozenset({0, 1, 2}), "rollout": frozenset({3, 5})})
    'optimizer 0-2, rollout 3,5'
    """
    def span(cores: frozenset[int]) -> str:
        c = sorted(cores)
        return f"{c[0]}-{c[-1]}" if len(c) > 2 and c[-1] - c[0] == len(c) - 1 else ",".join(map(str, c))
    return ", ".join(f"{role} {span(cores)}" for role, cores in sets.items())
