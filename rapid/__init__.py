"""rapid: large-batch PPO self-play for competitive multi-agent games.

Kept light on purpose: importing ``rapid.envs`` (or any bottom layer) must not import torch. The Python API
(``rapid.train``, ``rapid.load_policy``, ``rapid.PettingZooAgent``; see :mod:`rapid.api`) is imported on
first use.
"""

__version__ = "0.1.0"

_LAZY = {"train": "rapid.api", "load_policy": "rapid.api", "TrainedPolicy": "rapid.api",
         "PettingZooAgent": "rapid.agents.pz_agent"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'rapid' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
