"""rapid: large-batch PPO self-play for competitive multi-agent games.

Kept light on purpose: importing ``rapid.envs`` (or any bottom layer) must not import torch.
"""

__version__ = "0.1.0"
