"""Monitoring: Prometheus metrics per role, exporter and target discovery, Prometheus/Grafana assets, reports.

Bottom layer: imports nothing else from the project and never torch (see docs/architecture.md, Layers).
"""

from rapid.monitoring.metrics import (
    EvaluatorMetrics,
    LauncherMetrics,
    OptimizerMetrics,
    RolloutMetrics,
    collect_targets,
    register_process,
    write_file_sd,
)

__all__ = [
    "EvaluatorMetrics",
    "LauncherMetrics",
    "OptimizerMetrics",
    "RolloutMetrics",
    "collect_targets",
    "register_process",
    "write_file_sd",
]
