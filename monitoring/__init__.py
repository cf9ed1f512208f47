"""Monitoring: Prometheus metrics per role, exporter and target discovery, Prometheus/Grafana assets, reports.

Bottom layer: imports nothing else from the project and never torch (see docs/architecture.md, Layers).
"""

from rapid.monitoring.inference_metrics import InferenceMetrics
from rapid.monitoring.metrics import (
    EvaluatorMetrics,
    LauncherMetrics,
    RolloutMetrics,
    collect_targets,
    register_process,
    write_file_sd,
)
from rapid.monitoring.optimizer_metrics import OptimizerMetrics

__all__ = [
    "EvaluatorMetrics",
    "InferenceMetrics",
    "LauncherMetrics",
    "OptimizerMetrics",
    "RolloutMetrics",
    "collect_targets",
    "register_process",
    "write_file_sd",
]
