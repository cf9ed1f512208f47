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
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BoxPlan:
    workers: int
    cores: int
    kept: tuple[tuple[str, int], ...]
    """(what, cores) kept off the rollout workers."""

    def line(self) -> str:
        kept = ", ".join(f"{n} for {what}" for what, n in self.kept if n)
        return f"{self.workers} rollout worker(s) on {self.cores} cores, keeping {kept}"


def plan_box(cores: int, gpu: bool, node_inference: bool, decoders: int, evaluator: bool) -> BoxPlan:
    """Rollout workers for a machine of ``cores`` usable cores; at least one."""
    kept = (("the optimizer", 1),
            ("its decode processes", decoders if gpu else 0),
            ("the node inference server", 1 if node_inference else 0),
            ("the evaluator", 1 if gpu and evaluator else 0))
    return BoxPlan(max(1, cores - sum(n for _, n in kept)), cores, kept)
