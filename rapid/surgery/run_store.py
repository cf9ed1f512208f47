"""Surgery on a run's store: prepare everything in memory (read-only), then write it in an order that a crash
cannot turn into a run of neither shape.

Write order (docs/surgery.md):

1. **Stage** (invisible to every role): ``surgery/<V>/checkpoint.rck``, ``params.rpm``, ``config.toml`` and
   ``snapshots/<member>.rpm``. A crash here leaves the run in its old shape: nothing any role reads changed.
2. **Commit**: ``surgery/<V>.json``, written with ``put_if_absent``. From here on the run has the new shape.
3. **Finish** (idempotent, :func:`finish`): ``checkpoints/<V>.rck`` and ``checkpoints/LATEST``, ``params/<V>.rpm``
   and ``params/LATEST``, each snapshot rewritten in place, a new run id in ``layout.json`` (rollout nodes'
   caches of the old snapshots are not read again), the old shape's experience objects deleted, the run dir's
   ``config.toml`` replaced atomically, then ``surgery/<V>.done`` and the staged objects deleted. A crash here
   is finished by running ``rapid surgery --apply`` again; until then ``--resume`` refuses in one line
   (``rapid.optimizer.checkpoints.surgery_floor``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rapid.errors import FormatError, UsageError
from rapid.formats.checkpoint import LIMITS as CHECKPOINT_LIMITS
from rapid.formats.checkpoint import Checkpoint, encode_checkpoint
from rapid.formats.experience import Shape
from rapid.formats.params import LIMITS as PARAMS_LIMITS
from rapid.formats.params import ParamsObject, decode_params, encode_params
from rapid.infra.store import KeyNotFound, Store
from rapid.league import League
from rapid.optimizer.checkpoints import check_checkpoint, load_latest_checkpoint, newest_version_in_use
from rapid.roles.startup import build_policy, env_spec
from rapid.run.config import Config
from rapid.run.config_files import to_dict, to_toml
from rapid.run.param_store import ParameterStore
from rapid.run.store_map import (
    CHECKPOINTS_LATEST,
    EXPERIENCE_PREFIX,
    checkpoint_key,
    load_json,
    renew_run_id,
    snapshot_key,
    surgery_done_key,
    surgery_key,
    surgery_stage_prefix,
    write_version_pointer,
)
from rapid.surgery.inputs import experience_inputs, play_side_by_side
from rapid.surgery.shapes import Growth, PolicyShape, SurgeryRefused, plan_growth
from rapid.surgery.transform import grow_adam, grow_tensors, parameter_names
from rapid.surgery.verify import Preservation, compare

RECORD_FORMAT = "rapid.surgery"
GAMES, STEPS = 8, 48
"""Games played side by side in the old and the new env, and steps of each, for the check and the statistics."""


@dataclass
class Prepared:
    """A surgery computed in memory: what :func:`stage` and :func:`finish` write."""

    version: int
    """The version the surgery publishes: after every version in use in the store."""
    source: Checkpoint
    plan: list[Growth]
    checkpoint: Checkpoint
    params: bytes
    snapshots: dict[str, bytes]
    config_after: str
    record: dict
    skipped: dict[str, str] = field(default_factory=dict)
    """Snapshots left as they were, and why (they did not load before the surgery either)."""
    checks: dict[str, Preservation] = field(default_factory=dict)


def config_changes(old: Config, new: Config) -> list[str]:
    """``section.key: before → after`` for every value that differs (env options included)."""
    def flat(tree: dict, prefix: str = "") -> dict:
        out: dict[str, object] = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out
    a, b = flat(to_dict(old)), flat(to_dict(new))
    return [f"{k}: {a.get(k, '(unset)')} → {b.get(k, '(unset)')}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def _preserved(what: str, result: Preservation) -> Preservation:
    if not result.ok():
        raise SurgeryRefused(f"not function-preserving on {what}: {result.line()}")
    return result


def prepare(store: Store, old_cfg: Config, new_cfg: Config, seed: int = 0,
            new_action_bias: float = -30.0) -> Prepared:
    """Read the run, plan, transform and check everything; write nothing. SurgeryRefused / UsageError to refuse."""
    if new_cfg.env.name != old_cfg.env.name:
        raise SurgeryRefused(f"env.name changed ({old_cfg.env.name} → {new_cfg.env.name}): a different game")
    try:
        source = load_latest_checkpoint(store)
    except FormatError as e:
        raise UsageError(f"the newest checkpoint is not usable ({e}): resume the run once to write a good one") from e
    if source is None:
        raise UsageError(f"{store.describe()} has no checkpoint: surgery starts from one (train or resume first)")
    old_spec, new_spec = env_spec(old_cfg), env_spec(new_cfg)
    if (old_spec.num_agents, old_spec.side_of_agent) != (new_spec.num_agents, new_spec.side_of_agent):
        raise SurgeryRefused(f"the number of agents changed ({old_spec.num_agents} → {new_spec.num_agents})")
    try:
        old_policy = build_policy(old_cfg, old_spec, source.model)
    except ValueError as e:
        raise UsageError(f"checkpoint v{source.version} does not fit the run's config ({e})") from None
    old, new = PolicyShape.of(old_policy), PolicyShape.of(build_policy(new_cfg, new_spec))
    plan = plan_growth(old, new, new_action_bias)
    if not any(g.grows for g in plan):
        raise SurgeryRefused("the change leaves every tensor as it is: nothing for surgery to do (use --set on "
                             "--resume for other settings)")
    rng = np.random.default_rng(seed)
    played = play_side_by_side(_env(old_cfg, seed), _env(new_cfg, seed), old_policy, old, new, STEPS, seed)

    def grown(tensors: dict) -> dict:
        return grow_tensors(tensors, plan, rng, new_obs_mean=played.new_mean, new_obs_var=played.new_var)

    model = grown(old_policy.tensors())
    new_policy = build_policy(new_cfg, new_spec, model)
    checks = {"fresh games": _preserved("fresh games", compare(old_policy, new_policy, played.inputs))}
    recorded = experience_inputs(store, Shape.of(old_spec, old_cfg.rollout.bptt, old.lstm), old, new, rng)
    if recorded is not None:
        checks["the run's experience"] = _preserved("the run's experience", compare(old_policy, new_policy, recorded))
    version = (newest_version_in_use(store) or 0) + 1
    adam = grow_adam(source.adam, plan, parameter_names(old))
    checkpoint = Checkpoint(version, source.updates, model, adam, {"surgery": version, "from": source.version})
    check_checkpoint(checkpoint)
    snapshots, skipped = _snapshots(store, old_cfg, old_spec, new_cfg, new_spec, grown, played.inputs, version)
    prepared = Prepared(version, source, plan, checkpoint,
                        encode_params(ParamsObject(version, model, {"updates": source.updates, "surgery": version})),
                        snapshots, to_toml(new_cfg), {}, skipped, checks)
    prepared.record = {"format": RECORD_FORMAT, "version": version, "from_checkpoint": source.version,
                       "updates": source.updates, "time": time.time(), "seed": seed,
                       "changes": config_changes(old_cfg, new_cfg), "tensors": [g.line() for g in plan if g.grows],
                       "snapshots": sorted(snapshots), "skipped_snapshots": skipped,
                       "preservation": {k: v.line() for k, v in checks.items()},
                       "config_before": to_toml(old_cfg), "config_after": prepared.config_after}
    return prepared


def _env(cfg: Config, seed: int):
    from rapid.envs.registry import make_env

    return make_env(cfg.env.name, num_games=GAMES, seed=seed, options=cfg.env.options)


def _snapshots(store, old_cfg, old_spec, new_cfg, new_spec, grown, inputs, version):
    """Every snapshot member of the pool (active and retired) transformed and checked; those that do not load
    in the old shape are left as they are (they could not be played before either)."""
    out, skipped = {}, {}
    for member in League(store).read_or_empty().members.values():
        if member.kind != "snapshot":
            continue
        try:
            obj = decode_params(store.get(snapshot_key(member.id)))
            old_policy = build_policy(old_cfg, old_spec, obj.tensors)
        except (KeyNotFound, FormatError, ValueError) as e:
            skipped[member.id] = str(e)
            continue
        tensors = grown(old_policy.tensors())
        _preserved(f"snapshot {member.id}", compare(old_policy, build_policy(new_cfg, new_spec, tensors), inputs))
        out[member.id] = encode_params(ParamsObject(obj.version, tensors, {**obj.meta, "surgery": version}))
    return out, skipped


def stage(store: Store, p: Prepared) -> None:
    """Step 1: every new object under ``surgery/<V>/``, which no role reads."""
    prefix = surgery_stage_prefix(p.version)
    for member, data in p.snapshots.items():
        store.put(f"{prefix}snapshots/{member}.rpm", data)
    store.put(f"{prefix}params.rpm", p.params)
    store.put(f"{prefix}config.toml", p.config_after.encode())
    store.put(f"{prefix}checkpoint.rck", encode_checkpoint(p.checkpoint))


def commit(store: Store, p: Prepared) -> None:
    """Step 2: the record. Its existence makes the new shape the run's."""
    if not store.put_if_absent(surgery_key(p.version), json.dumps(p.record, indent=1).encode()):
        raise UsageError(f"{surgery_key(p.version)} already exists: another surgery made v{p.version}")


def finish(store: Store, version: int, run_dir: str | None) -> list[str]:
    """Step 3 for the committed surgery that made ``version``: move every pointer, rewrite the snapshots, the
    run id and the config; idempotent (the staged objects go only after ``surgery/<V>.done``), so a crash in it
    is finished by calling it again. Returns what it did."""
    prefix = surgery_stage_prefix(version)
    done = []
    if not store.exists(surgery_done_key(version)):
        record = load_json(store.get(surgery_key(version)))
        store.put(checkpoint_key(version), store.get(f"{prefix}checkpoint.rck", max_bytes=CHECKPOINT_LIMITS.max_bytes))
        write_version_pointer(store, CHECKPOINTS_LATEST, version)
        ParameterStore(store).publish_encoded(version, store.get(f"{prefix}params.rpm",
                                                                 max_bytes=PARAMS_LIMITS.max_bytes))
        for member in record["snapshots"]:
            store.put(snapshot_key(member), store.get(f"{prefix}snapshots/{member}.rpm",
                                                      max_bytes=PARAMS_LIMITS.max_bytes))
        renew_run_id(store)
        old_experience = store.list(EXPERIENCE_PREFIX)  # of the old shape: the loader would only count it bad
        for key in old_experience:
            store.delete(key)
        done += [f"checkpoint v{version} (checkpoints/LATEST)", f"published v{version} (params/LATEST)",
                 f"{len(record['snapshots'])} snapshot(s), rewritten in place", "a new run id (layout.json)",
                 f"{len(old_experience)} experience object(s) of the old shape deleted"]
        if run_dir is not None:
            _replace_file(Path(run_dir) / "config.toml", record["config_after"])
            done.append(f"{Path(run_dir) / 'config.toml'}")
        store.put(surgery_done_key(version), b"")
    for key in store.list(prefix):
        store.delete(key)
    return done


def _replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a crash leaves the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.surgery")
    tmp.write_text(text)
    os.replace(tmp, path)
