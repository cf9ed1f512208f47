"""`rapid surgery`: carry a run through a change of its observations, model size or actions (docs/surgery.md).

    rapid surgery --run-dir runs/moba --set model.lstm=128 --set env.options.observe_cooldowns=true
    rapid surgery --run-dir runs/moba --set model.lstm=128 --set env.options.observe_cooldowns=true --apply
    rapid train --run-dir runs/moba --resume

Without ``--apply`` it prints the plan and the preservation check and writes nothing. A refusal (no checkpoint,
an unsupported change, a change that does not preserve the policy, a run another optimizer holds) is one line
and exit code 2, with nothing written; a store that cannot be reached is one line and exit code 1.
"""

from __future__ import annotations

import argparse
import sys

HELP = "carry a run through a change of observations, model size or actions, keeping what it learnt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", "-r", metavar="DIR", required=True,
                        help="run directory (its config.toml; its store unless --store)")
    parser.add_argument("--store", metavar="URL", help="the run's store instead of its config's, e.g. s3://bucket/run")
    parser.add_argument("--set", "-s", metavar="SECTION.KEY=VALUE", action="append", default=[],
                        help="the change, e.g. --set model.lstm=256 --set env.options.observe_cooldowns=true")
    parser.add_argument("--apply", action="store_true", help="write it (default: show the plan, write nothing)")
    parser.add_argument("--settle-updates", type=int, default=0, metavar="N",
                        help="after the surgery, train N updates with learning rate 0 so Adam's moments settle "
                             "while the weights stay (OpenAI Five's practice; sets ppo.settle_until_update)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the new units' weights and the check's games")
    parser.add_argument("--new-action-bias", type=float, default=-30.0,
                        help="bias of a new action's logit (default -30: chosen with probability ~e^-30)")


def _configs(args):
    from pathlib import Path

    from rapid.errors import UsageError
    from rapid.run.config_files import load_config

    path = Path(args.run_dir) / "config.toml"
    if not path.is_file():
        raise UsageError(f"{args.run_dir} is not a run directory (no config.toml)")
    pinned = [f'run.dir="{Path(args.run_dir).as_posix()}"'] + ([f'store.url="{args.store}"'] if args.store else [])
    return load_config(path, pinned), load_config(path, [*pinned, *args.set])


def _settle(args, new_cfg, store):
    """``new_cfg`` with ``ppo.settle_until_update`` N updates past the run's newest checkpoint."""
    from dataclasses import replace

    from rapid.errors import UsageError
    from rapid.optimizer.checkpoints import load_latest_checkpoint

    if args.settle_updates < 0:
        raise UsageError(f"--settle-updates must be 0 or more, not {args.settle_updates}")
    if not args.settle_updates:
        return new_cfg
    newest = load_latest_checkpoint(store)
    if newest is None:
        raise UsageError(f"{store.describe()} has no usable checkpoint to operate on")
    return replace(new_cfg, ppo=replace(new_cfg.ppo, settle_until_update=newest.updates + args.settle_updates))


def run(args: argparse.Namespace) -> int:
    from rapid.errors import FormatError, UsageError
    from rapid.infra.store import StoreError

    try:
        return _run(args)
    except UsageError as e:
        print(f"rapid surgery: refused: {e}", file=sys.stderr)
        return 2
    except (StoreError, FormatError) as e:
        print(f"rapid surgery: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _run(args) -> int:
    from rapid.errors import UsageError
    from rapid.roles.startup import StopFlag, open_run_store
    from rapid.run.lease import RunLease
    from rapid.run.store_map import surgery_stage_prefix, surgery_states
    from rapid.surgery import run_store

    old_cfg, new_cfg = _configs(args)
    store = open_run_store(old_cfg)
    new_cfg = _settle(args, new_cfg, store)
    states = surgery_states(store)
    pending = [v for v, done in states.items() if not done]
    leftovers = [v for v, done in states.items() if done and store.list(surgery_stage_prefix(v))]
    if pending or (leftovers and args.apply):
        if not args.apply:
            raise UsageError(f"the surgery that made v{pending[-1]} was interrupted after its commit: add --apply "
                             "to finish it (and nothing else)")
        with _held(RunLease(store).acquire(), StopFlag(install_signals=False)):
            for version in pending:
                for line in run_store.finish(store, version, args.run_dir):
                    print(f"finished surgery v{version}: {line}")
            for version in leftovers:  # a crash after the surgery completed left staged copies behind
                run_store.finish(store, version, args.run_dir)
                print(f"surgery v{version}: staged copies deleted")
        if pending or not args.set:
            return 0
    if not args.set:
        raise UsageError("nothing to change: name it with --set, e.g. --set model.lstm=256")
    lease = RunLease(store).acquire() if args.apply else None  # refuses while an optimizer holds the run
    try:
        prepared = run_store.prepare(store, old_cfg, new_cfg, seed=args.seed, new_action_bias=args.new_action_bias)
    except BaseException:
        if lease:
            lease.abandon()  # it wrote one lease epoch: gone again, the store is as it was
        raise
    print(describe(prepared, store.describe()))
    if lease is None:
        print("plan only: nothing written (add --apply to write it)")
        return 0
    stop = StopFlag(install_signals=False)
    if not lease.renew():  # the checks took long and another optimizer took the run meanwhile
        raise UsageError("another optimizer took this run's lease during the checks: nothing written")
    with _held(lease, stop):
        run_store.stage(store, prepared)
        if stop:
            raise UsageError("the run's lease was lost while staging: not committed (the run keeps its old shape)")
        run_store.commit(store, prepared)
        for line in run_store.finish(store, prepared.version, args.run_dir):
            print(f"done: {line}")
    print(f"surgery v{prepared.version} done: resume with `rapid train --run-dir {args.run_dir} --resume`")
    return 0


class _held:
    """The run's lease renewed while a block writes, released after it."""

    def __init__(self, lease, stop):
        self.lease, self.stop = lease, stop

    def __enter__(self):
        self.lease.keep(self.stop)
        return self.lease

    def __exit__(self, *exc):
        self.lease.release()
        return False


def describe(p, where: str) -> str:
    """The plan as people read it: what changes, which tensors grow, which snapshots change, the checks."""
    r = p.record
    lines = [f"surgery of {where}: checkpoint v{p.source.version} (update {p.source.updates}) → v{p.version}",
             "config:", *(f"  {c}" for c in r["changes"]),
             "tensors that grow (the others are copied):", *(f"  {t}" for t in r["tensors"]),
             f"Adam: the moments of {len(p.checkpoint.adam['state'])} parameters grow with their weights (zeros where "
             f"new), step kept",
             f"snapshots: {len(p.snapshots)} transformed {sorted(p.snapshots)}"]
    lines += [f"  {m} left as it is: {why}" for m, why in p.skipped.items()]
    lines += [f"preserved on {what}: {check.line()}" for what, check in p.checks.items()]
    return "\n".join(lines)
