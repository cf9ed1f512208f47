"""rapid's Python API: train a run, then load a trained policy and act with it in your own code.

``rapid.train`` and ``rapid.load_policy`` (exposed lazily by ``rapid/__init__.py``, so ``import rapid`` stays
light) wrap the same roles and stores as the ``rapid`` command; the README's "After training" section shows
them end to end. A policy is loaded from a run directory (its ``config.toml`` says the env and model) or
from a run's store URL with the run's config:

>>> import tempfile
>>> from rapid.run.config_files import load_config
>>> from rapid.roles.startup import build_policy, env_spec
>>> run = publish_untrained(load_config(None, ["model.hidden=16", "model.lstm=16"]), tempfile.mkdtemp())
>>> policy = load_policy(run)                       # version="latest"; or 3, "3", "v3"
>>> policy.version, policy.spec.obs_dim, policy.spec.action_heads
(1, 84, (7,))
>>> state = policy.initial_state(2)                 # zeros, one row per agent you act for
>>> obs, mask = np.zeros((2, 84), np.float32), np.ones((2, 7), bool)
>>> actions, state, value = policy.act(obs, mask, state, greedy=True)
>>> actions.shape, state[0].shape, value.shape
((2, 1), (2, 16), (2,))
>>> policy.act(np.zeros((2, 27), np.float32), mask, state)
Traceback (most recent call last):
rapid.errors.UsageError: observations have 27 values; this policy (pettingzoo.classic.connect_four_v3) takes 84
>>> load_policy(run, env="pettingzoo.classic.tictactoe_v3")
Traceback (most recent call last):
rapid.errors.UsageError: ... plays pettingzoo.classic.connect_four_v3, not pettingzoo.classic.tictactoe_v3
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rapid.envs.base import EnvSpec, VecMultiAgentEnv
from rapid.errors import UsageError
from rapid.run.config import Config
from rapid.run.config_files import load_config

State = tuple[np.ndarray, np.ndarray]
"""An LSTM state (h, c), float32 [n, model.lstm] each: one row per agent."""


class Acted(NamedTuple):
    actions: np.ndarray
    """int64 [n, heads]: one choice per action head (connect four: one head, the column)."""
    state: State
    value: np.ndarray
    """float32 [n]: the value head's estimate of each agent's return from here, in reward units."""


class TrainedPolicy:
    """A published parameter version of a run, ready to act: the observation normalizer is inside it, and
    the LSTM state is yours to carry (one row per agent; zeros at the start of each of its games). ``model`` is
    the torch module (``rapid.opt.model.Policy``, in eval mode), ``spec`` the env's shape, ``config`` the run's."""

    def __init__(self, model, spec: EnvSpec, config: Config, version: int):
        self.model, self.spec, self.config, self.version = model, spec, config, version

    @property
    def env_name(self) -> str:
        return self.config.env.name

    def initial_state(self, n: int) -> State:
        h, c = self.model.initial_state(n)
        return h.numpy(), c.numpy()

    def act(self, obs: np.ndarray, mask: np.ndarray | None = None, state: State | None = None,
            greedy: bool = False) -> Acted:
        """One step for n agents: ``obs`` float [n, obs_dim], ``mask`` bool [n, sum(action_heads)] (None: every
        action allowed), ``state`` from ``initial_state(n)`` or the last call (None: a fresh start). Samples
        each head's action, or with ``greedy`` takes the most likely one."""
        import torch

        obs = np.asarray(obs, dtype=np.float32)
        if obs.ndim != 2 or obs.shape[1] != self.spec.obs_dim:
            raise UsageError(f"observations have {obs.shape[-1] if obs.ndim else 0} values; this policy "
                             f"({self.env_name}) takes {self.spec.obs_dim}" + ("" if obs.ndim == 2 else
                                                                                " in rows of [n, obs_dim]"))
        n = obs.shape[0]
        mask = np.ones((n, self.spec.mask_dim), bool) if mask is None else np.asarray(mask, dtype=bool)
        if mask.shape != (n, self.spec.mask_dim):
            raise UsageError(f"action mask has shape {mask.shape}; this policy ({self.env_name}) takes "
                             f"({n}, {self.spec.mask_dim}) for action heads {self.spec.action_heads}")
        h, c = self.initial_state(n) if state is None else state
        if np.shape(h) != (n, self.model.lstm_size) or np.shape(c) != (n, self.model.lstm_size):
            raise UsageError(f"state has shape {np.shape(h)}; this policy takes ({n}, {self.model.lstm_size}): "
                             "use initial_state(n)")
        out = self.model.act(torch.from_numpy(obs), torch.from_numpy(mask),
                             (torch.as_tensor(h, dtype=torch.float32), torch.as_tensor(c, dtype=torch.float32)),
                             greedy=greedy)
        return Acted(out.actions.numpy(), (out.state[0].numpy(), out.state[1].numpy()), out.value.numpy())

    def make_env(self, num_games: int = 1, seed: int = 0) -> VecMultiAgentEnv:
        """The run's game (its env and options), ``num_games`` at once."""
        from rapid.envs.registry import make_env

        return make_env(self.env_name, num_games=num_games, seed=seed, options=self.config.env.options)

    def player(self, greedy: bool = False):
        """A player for ``rapid.run.matches.play_match``: every agent of a side, its state reset at each game."""
        from rapid.run.matches import PolicyPlayer

        return PolicyPlayer(self.model, self.spec, f"v{self.version}", greedy=greedy)


def load_policy(source: str | os.PathLike, version: int | str = "latest", *, config: Config | str | None = None,
                env: str | None = None) -> TrainedPolicy:
    """A published version of a run. ``source`` is a run directory, or a store URL (``s3://bucket/run``, a
    store folder) with ``config`` (the run's TOML, or a Config) saying its env and model, or a frozen reference
    file (``rapid export --format reference``: a strength ladder's ``ref:PATH``). With ``env``, a
    run of another game is refused; a version whose shape does not fit the run's model (one from before a
    surgery) is refused too. Errors are UsageError, one line."""
    from rapid.roles.startup import env_spec, open_run_store
    from rapid.run.matches import load_policy as load_version
    from rapid.run.matches import resolve_version
    from rapid.run.param_store import ParameterStore

    if config is None and Path(source).is_file():
        return load_reference(Path(source), env)
    cfg = source_config(source, config)
    if env is not None and env != cfg.env.name:
        raise UsageError(f"{source} plays {cfg.env.name}, not {env}")
    params = ParameterStore(open_run_store(cfg))
    number = resolve_version(params, str(version))
    spec = env_spec(cfg)
    return TrainedPolicy(load_version(cfg, spec, params, number), spec, cfg, number)


def load_reference(path: str | os.PathLike, env: str | None = None) -> TrainedPolicy:
    """A frozen reference policy file as a TrainedPolicy (its version is the one it was exported from)."""
    from rapid.roles.startup import build_policy, env_spec
    from rapid.run.ladder_rungs import reference_config

    obj, cfg = reference_config(Path(path))
    if env is not None and env != cfg.env.name:
        raise UsageError(f"{path} plays {cfg.env.name}, not {env}")
    spec = env_spec(cfg)
    try:
        model = build_policy(cfg, spec, obj.tensors)
    except (ValueError, RuntimeError) as e:
        raise UsageError(f"{path}: its weights do not fit its game ({e})") from None
    return TrainedPolicy(model, spec, cfg, obj.version)


def source_config(source: str | os.PathLike, config: Config | str | os.PathLike | None = None) -> Config:
    """The config of the run at ``source``: a run directory's own, or ``config`` pointed at a store URL."""
    text = os.fspath(source)
    if config is None:
        return run_dir_config(text)
    cfg = config if isinstance(config, Config) else load_config(config)
    if "://" not in text and not Path(text).is_dir():
        raise UsageError(f"{text}: no such store")
    return replace(cfg, store=replace(cfg.store, url=text))


def run_dir_config(run_dir: str | os.PathLike | None, extra: Sequence[str] = ()) -> Config:
    """The config saved in a run directory, with the run directory pinned to where it is now."""
    if not run_dir:
        raise UsageError("--run-dir is required")
    path = Path(run_dir) / "config.toml"
    if not Path(run_dir).is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    if not path.is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.toml)")
    cfg = load_config(path, [f'run.dir="{Path(run_dir).as_posix()}"', *extra])
    if cfg.pbt.member >= 0:  # a population member's folder, members/m<K>: run.dir names the population's
        cfg.run.dir = Path(run_dir).parent.parent.as_posix()
    return cfg


@dataclass
class TrainResult:
    run_dir: Path
    summary: str
    """What `rapid train` prints at the end: versions, samples, balance, the last and best evaluation."""
    exit_code: int
    """0 for a clean stop (time, updates, target win rate); 1 when the optimizer failed."""


def train(config: Config | str | os.PathLike | None = None, minutes: float | None = None,
          updates: int | None = None, run_dir: str | os.PathLike | None = None, overrides: Sequence[str] = (),
          workers: int | None = None, in_process: bool = False, progress: bool = False) -> TrainResult:
    """`rapid train` from Python: ``config`` is a Config, a TOML path or None (the defaults), ``overrides``
    ``section.key=value`` strings as ``--set`` takes them. Runs until ``minutes``, ``updates`` or the config's
    own stop; ``in_process`` runs the roles as threads of this process (their logs go to the run's
    ``logs/in-process.log``). Returns the run directory and the summary. Bad config: UsageError."""
    from rapid.roles.launcher import fresh_run_dir, run_train

    run: dict[str, Any] = {k: v for k, v in (("minutes", minutes), ("updates", updates), ("num_workers", workers),
                             ("dir", None if run_dir is None else Path(run_dir).as_posix())) if v is not None}
    if isinstance(config, Config):
        if overrides:
            raise UsageError("overrides go with a TOML config; set the Config's fields instead")
        from rapid.run.config_files import build_config, to_dict

        cfg = build_config(to_dict(replace(config, run=replace(config.run, **run))))  # checked as a loaded one is
    else:
        cfg = load_config(config, [*overrides, *(f"run.{k}={json.dumps(v)}" for k, v in run.items())])
    if not cfg.run.dir:
        cfg.run.dir = fresh_run_dir(cfg.run.name)
    # The launcher takes SIGINT/SIGTERM to stop its roles cleanly; give the caller's handlers back afterwards.
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        outcome = run_train(cfg, show_progress=progress, in_process=in_process, echo=progress)
    finally:
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)
    return TrainResult(Path(cfg.run.dir), outcome.summary, outcome.exit_code)


def publish_untrained(cfg: Config, run_dir: str | os.PathLike, version: int = 1) -> Path:
    """A run directory holding ``cfg`` and one published version of a freshly initialized policy: what
    examples, tests and exports use where no training is needed."""
    from rapid.roles.startup import build_policy, env_spec, open_run_store
    from rapid.run.config_files import to_toml
    from rapid.run.param_store import ParameterStore

    cfg.run.dir = Path(run_dir).as_posix()
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "config.toml").write_text(to_toml(cfg))
    ParameterStore(open_run_store(cfg)).publish(version, build_policy(cfg, env_spec(cfg)).tensors())
    return Path(run_dir)
