"""The box model behind ``benchmarks/bench_box.py``: one GPU box (rollout workers, the node's inference server, the
optimizer with its loader, decode processes, buffer and learner, the evaluator) sharing C cores and one GPU in
simulated time, driven by rapid's own loops as the scale model (``benchmarks/fleet``) drives them."""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # benchmarks/, for the scale model's fleet.*
    sys.path.append(str(Path(__file__).resolve().parents[1]))
