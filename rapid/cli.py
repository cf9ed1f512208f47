"""The `rapid` command and its role entry points (`rapid-optimizer`, `rapid-rollout`, `rapid-league`).

Bad arguments or configuration, and a corrupt stored object a command reads, print one line and exit with code 2;
an unreachable store exits 1 with one line; none dumps a traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rapid.agents import cli as agent_cli
from rapid.api import run_dir_config
from rapid.errors import FormatError, InferenceUnavailable, UsageError

INVOKED = time.time()  # before torch is imported (by the commands): `rapid train`'s first minutes count from here

WORKER_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}", re.ASCII)

EPILOG = """examples:
  rapid train                                        # connect-four self-play in runs/run until Ctrl-C (run.minutes = 0)
  rapid train --config configs/default.toml          # the quick start: 5 minutes, learns to beat random
  rapid train --config configs/moba-1v1.toml --minutes 20
  rapid train --run-dir runs/run --resume            # continue a stopped run
  rapid eval --run-dir runs/run --against random --games 400
  rapid league ls --run-dir runs/run
  rapid config show --config configs/moba-1v1.toml --set ppo.lr=1e-4
  rapid export --run-dir runs/run --format onnx --out policy.onnx
  rapid play --run-dir runs/run                      # you against the policy (connect four, tictactoe)
  rapid watch --run-dir runs/moba --against lane     # a moba match live in the browser
  mpiexec -n 4 rapid-optimizer --config run.toml --set store.url=s3://bucket/run
"""


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="TOML", help="run config file (default: built-in defaults)")
    p.add_argument("--set", "-s", metavar="SECTION.KEY=VALUE", action="append", default=[],
                   help="override one config value, e.g. --set ppo.lr=3e-4 (repeatable)")


def _run_dir_arg(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--run-dir", "-r", metavar="DIR", required=required,
                   help="run directory (its config.toml and store are used)")


def _resume(text: str) -> str:
    if text != "auto":
        raise argparse.ArgumentTypeError(f"takes no value or 'auto' (got {text!r})")
    return text


def _resume_arg(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--resume", nargs="?", const=True, default=False, type=_resume, metavar="auto", help=text)


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one line (usage stays in --help), exit code 2; subcommands inherit it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="rapid", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Large-batch PPO self-play for competitive multi-agent games, from a laptop to a cluster.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("train", help="train on this machine: optimizer, rollout workers and evaluator as processes")
    _config_args(p)
    _run_dir_arg(p)
    p.add_argument("--minutes", type=float, help="stop after this many minutes (run.minutes)")
    p.add_argument("--updates", type=int, help="stop after this many optimizer updates (run.updates)")
    p.add_argument("--workers", type=int, help="rollout worker processes (run.num_workers)")
    _resume_arg(p, "continue the run in --run-dir from its newest checkpoint; --resume auto: continue it if "
                   "--run-dir holds one, else start it")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.add_argument("--in-process", action="store_true",
                   help="the same roles as threads of this one process (for a debugger and fast tests)")
    p.add_argument("--pbt", type=int, metavar="N", help="a population of N members, each a whole run, that play "
                   "each other and copy the best on the ladder (pbt.members; docs/pbt.md)")

    p = sub.add_parser("config", help="show the effective configuration")
    p.add_argument("action", choices=["show"])
    _config_args(p)
    p.add_argument("--doc", action="store_true", help="every field with its type, value, default and doc")

    p = sub.add_parser("eval", help="play a params version against a baseline, or rate it on the strength ladder",
                       epilog="e.g. rapid eval --run-dir runs/c4 --ladder; rapid eval --ladder configs/default.toml "
                              "--calibrate --games 400")
    _run_dir_arg(p)
    p.add_argument("--ladder", nargs="?", const="", metavar="CONFIG",
                   help="rate the version on the strength ladder (eval.ladder) of the run's config, or of CONFIG: its "
                        "games against every rung and one rating on the ladder's scale (random at 0)")
    p.add_argument("--calibrate", action="store_true",
                   help="with --ladder: play every pair of rungs --games games and print the rungs' ratings as the "
                        "config's [eval.ladder] table (no run needed)")
    p.add_argument("--version", default="latest", help="params version: latest, 12 or v12 (default latest)")
    p.add_argument("--against", default="random", help="a bot name (random, lane…) or a version (default random)")
    p.add_argument("--games", type=int, default=200, help="games to play (default 200)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--greedy", action="store_true", help="policies play their most likely action (default: sample)")
    p.add_argument("--set", "-s", metavar="SECTION.KEY=VALUE", action="append", default=[],
                   help="play in a variant of the run's game, e.g. --set env.options.fountain_heal=0.1 "
                        "(repeatable; a change of the observation or actions is refused)")

    for role, text in (("optimizer", "an optimizer rank (run under mpiexec for several ranks)"),
                       ("rollout", "a rollout worker (one per process or MPI rank)"),
                       ("evaluator", "the evaluator: rates new versions against the baseline"),
                       ("inference", "the node's inference server (rollout.inference = node; a node's first worker "
                                     "starts it if none runs)")):
        p = sub.add_parser(role, help=text)
        _config_args(p)
        if role == "optimizer":
            _resume_arg(p, "continue from the store's newest checkpoint; --resume auto: continue if the store "
                           "holds this run, start it if the store holds none (what a restarted job runs)")
        if role == "rollout":
            p.add_argument("--worker-id",
                           help="worker name (default: RAPID_WORKER_ID, else w<MPI/Slurm rank>, else w<pid>)")
            p.add_argument("--seed", type=int, help="worker seed (default: run.seed and the worker's rank)")

    agent_cli.add_parsers(sub, _run_dir_arg)

    p = sub.add_parser("retry", help="run an optimizer job again when it fails (a cluster job: no launcher restarts "
                                     "it)", description="Run the command; when it fails (not a clean stop, not a usage "
                       "error) run it again, after 1, 2, 4 … s, as `rapid train` restarts its optimizer; with "
                       "--resume auto it continues from the newest checkpoint. SIGTERM/SIGINT reach the command and "
                       "end the retries.",
                       epilog="e.g. rapid retry -- srun --kill-on-bad-exit=1 rapid-optimizer --config run.toml "
                              "--resume auto")
    p.add_argument("--max-restarts", type=int, default=3,
                   help="restarts in a row before giving up (default 3; ten healthy minutes clear the count)")
    p.add_argument("job", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the job's command (with --resume auto)")

    p = sub.add_parser("report", help="write PNG plots of a run from its logs")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", help="output folder (default RUN_DIR/report)")

    p = sub.add_parser("monitor", help="start a local Prometheus scraping a run's processes")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--targets-only", action="store_true",
                   help="no Prometheus: keep RUN_DIR/metrics/targets.json (file_sd) fresh for one that runs elsewhere")
    p.add_argument("--once", action="store_true", help="with --targets-only: write the list once and exit")

    from rapid.league import cli as league_cli

    for command in league_cli.build_parser(sub):
        _run_dir_arg(command)
        command.add_argument("--store", help="store URL of the run instead of --run-dir, e.g. s3://bucket/run")
    from rapid.roles import pbt_cli
    from rapid.surgery import cli as surgery_cli

    pbt_cli.add_arguments(sub.add_parser("pbt", help=pbt_cli.HELP), _run_dir_arg)
    surgery_cli.add_arguments(sub.add_parser("surgery", help=surgery_cli.HELP, description=surgery_cli.__doc__,
                                             formatter_class=argparse.RawDescriptionHelpFormatter))
    return parser


def load(args: argparse.Namespace, extra: Sequence[str] = ()):
    from rapid.run.config_files import load_config

    return load_config(getattr(args, "config", None), [*args.set, *extra])


def cmd_train(args) -> int:
    from rapid.roles.launcher import fresh_run_dir, holds_run, run_train

    extra = [f"run.{k}={v}" for k, v in (("minutes", args.minutes), ("updates", args.updates),
                                         ("num_workers", args.workers)) if v is not None]
    extra += [f"pbt.members={args.pbt}"] if args.pbt is not None else []
    resume = args.resume
    if resume == "auto":
        if not args.run_dir:
            raise UsageError("--resume auto needs --run-dir: the run to continue, or to start there")
        resume = holds_run(Path(args.run_dir)) or (Path(args.run_dir) / "store" / "pbt").is_dir()  # a population
    if resume:
        cfg = run_dir_config(args.run_dir, [*args.set, *extra])
    else:
        cfg = load(args, extra + ([f'run.dir="{args.run_dir}"'] if args.run_dir else []))
        if not cfg.run.dir:  # no directory asked for: a fresh one, never someone's earlier run
            cfg.run.dir = fresh_run_dir(cfg.run.name)
    if cfg.pbt.members and cfg.pbt.member < 0:  # the population; a member (pbt.member = K) is a run
        from rapid.roles.pbt_launcher import run_population

        return run_population(cfg, resume=bool(resume), show_progress=not args.no_progress)
    return run_train(cfg, resume=resume, show_progress=not args.no_progress,
                     in_process=args.in_process, started=INVOKED).exit_code


def cmd_config(args) -> int:
    from rapid.run.config_files import to_toml
    from rapid.run.config_schema import describe

    cfg = load(args)
    sys.stdout.write(describe(cfg) if args.doc else to_toml(cfg))
    return 0


def cmd_eval(args) -> int:
    from rapid.envs.registry import make_env
    from rapid.roles.startup import open_run_store
    from rapid.run.matches import batch_size, make_player, play_match
    from rapid.run.param_store import ParameterStore

    if args.games < 1:
        raise UsageError("--games must be at least 1")
    if args.ladder is not None or args.calibrate:
        from rapid.run.ladder import eval_ladder

        return eval_ladder(args)
    cfg = run_dir_config(args.run_dir, args.set)
    params = ParameterStore(open_run_store(cfg))
    env = make_env(cfg.env.name, num_games=batch_size(args.games), seed=args.seed, options=cfg.env.options)
    a = make_player(args.version, cfg, env, params, seed=args.seed, greedy=args.greedy)
    b = make_player(args.against, cfg, env, params, seed=args.seed + 1, greedy=args.greedy)
    result = play_match(env, a, b, args.games, seed=args.seed)
    print(result.line(a.name, b.name))
    return 0


def cmd_role(args) -> int:
    from rapid.infra.distributed import abort_on_error, detect_identity

    identity = detect_identity()
    with abort_on_error(identity):
        cfg = load(args)
        if args.command == "rollout":
            from rapid.roles.rollout import run_rollout, worker_name
            from rapid.roles.startup import rollout_seed

            worker = worker_name(args.worker_id or cfg.rollout.worker_id, os.environ, identity)
            if not WORKER_ID.fullmatch(worker):  # it is a folder in the store's keys
                raise UsageError(f"--worker-id {worker!r}: use 1-64 of A-Z a-z 0-9 . _ -, not starting with . or -")
            # Pods and job-array tasks all have rank 0: their name must tell their games apart.
            seed = args.seed if args.seed is not None else rollout_seed(cfg.run.seed, worker, identity.rank)
            # Without MPI the metrics rank comes from the name: w<N> is rank N; any other name (a pod's) a stable
            # hash, not its digits (pods whose names share their digits wrote one metrics target file).
            from rapid.run.store_map import shard_of

            numbered = re.fullmatch(r"w([0-9]{1,9})", worker, re.ASCII)
            rank = (identity.rank if identity.size > 1 else int(numbered.group(1)) if numbered
                    else shard_of(worker, 1 << 30))
            return run_rollout(cfg, worker, seed, rank=rank, local_rank=identity.local_rank)
        if args.command == "evaluator":
            from rapid.roles.evaluator import run_evaluator

            return run_evaluator(cfg)
        if args.command == "inference":
            from rapid.roles.inference import run_inference_server

            return run_inference_server(cfg)
        from rapid.roles.optimizer import pick_device, run_optimizer
        from rapid.roles.startup import check_run_dir

        check_run_dir(cfg)
        _, backend = pick_device(cfg, identity)  # refuses optimizer.device = cuda without CUDA before any rendezvous
        started = time.time()
        if identity.size == 1 and not cfg.optimizer.group_for_one:
            code = run_optimizer(cfg, resume=args.resume, rank=identity)
        else:
            from rapid.infra.distributed import init_process_group

            with init_process_group(identity, backend=backend, timeout=cfg.optimizer.collective_timeout_s,
                                    group_for_one=cfg.optimizer.group_for_one) as ctx:
                code = run_optimizer(cfg, resume=args.resume, rank=identity, ctx=ctx)
        if identity.rank == 0:
            from rapid.roles.optimizer_report import optimizer_summary

            print(optimizer_summary(cfg.derive().run_dir, started, code), flush=True)
        return code


def cmd_retry(args) -> int:
    from rapid.roles.retry import run_retry

    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    return run_retry(job, args.max_restarts)


def cmd_report(args) -> int:
    from rapid.monitoring.report import write_report

    if not (Path(args.run_dir) / "logs").is_dir():
        raise UsageError(f"{args.run_dir} is not a run directory (no logs/)")
    out = args.out or str(Path(args.run_dir) / "report")
    for path in write_report(args.run_dir, out):
        print(path)
    return 0


def cmd_monitor(args) -> int:
    from rapid.monitoring.prom import find_prometheus, run_monitor, write_targets

    if not Path(args.run_dir).is_dir():
        raise UsageError(f"{args.run_dir} is not a run directory")
    if args.once and not args.targets_only:
        raise UsageError("--once goes with --targets-only")
    if args.targets_only:
        return write_targets(args.run_dir, once=args.once)
    if find_prometheus() is None:
        raise UsageError("prometheus is not installed (Debian: apt-get install prometheus)")
    return run_monitor(args.run_dir, port=args.port)


def cmd_league(args) -> int:
    from rapid.infra.store import InvalidKey, StoreError, open_store
    from rapid.league import cli as league_cli

    if args.store:
        try:
            store = open_store(args.store)
        except (InvalidKey, StoreError, OSError) as e:  # OSError: a path that is a file, e.g. /dev/null
            why = getattr(e, "strerror", None) or e
            raise UsageError(f"--store {args.store}: not usable as a store ({why})") from None
        cfg = None
    else:
        cfg = run_dir_config(args.run_dir)
        from rapid.roles.startup import open_run_store

        store = open_run_store(cfg)
    return league_cli.run(args, store, play_match=_league_play_match(cfg, store) if cfg else None)


def _league_play_match(cfg, store):
    """Plays league members against each other for `rapid league rate`."""
    from rapid.envs.registry import make_env
    from rapid.league import League
    from rapid.roles.startup import build_policy
    from rapid.run.matches import PolicyPlayer, batch_size, play_match

    league = League(store)

    def player(member_id: str, env):
        if member_id.startswith("bot:"):
            return env.make_bot(member_id[4:], seed=0)
        return PolicyPlayer(build_policy(cfg, env.spec, league.load_policy(member_id).tensors), env.spec, member_id)

    def play(a: str, b: str, games: int) -> tuple[int, int, int]:
        env = make_env(cfg.env.name, num_games=batch_size(games), seed=cfg.run.seed, options=cfg.env.options)
        result = play_match(env, player(a, env), player(b, env), games, seed=cfg.run.seed)
        return result.wins, result.losses, result.draws

    return play


def cmd_pbt(args) -> int:
    from rapid.roles import pbt_cli

    return pbt_cli.run(args, run_dir_config(args.run_dir) if args.run_dir else None)


def cmd_surgery(args) -> int:
    from rapid.surgery import cli as surgery_cli

    return surgery_cli.run(args)


COMMANDS = {"train": cmd_train, "config": cmd_config, "eval": cmd_eval, "optimizer": cmd_role,
            "rollout": cmd_role, "evaluator": cmd_role, "inference": cmd_role,
            "retry": cmd_retry, "report": cmd_report, **agent_cli.COMMANDS,
            "monitor": cmd_monitor, "league": cmd_league, "surgery": cmd_surgery,
            "pbt": cmd_pbt}


def main(argv: list[str] | None = None) -> int:
    from rapid.infra.identity import LayoutError
    from rapid.infra.store import StoreError

    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (UsageError, LayoutError) as e:  # LayoutError: a launcher's variables or devices that cannot run
        print(f"rapid: error: {e}", file=sys.stderr)
        return 2
    except FormatError as e:  # bad input, as a bad argument is
        print(f"rapid: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except (StoreError, InferenceUnavailable) as e:
        print(f"rapid: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def optimizer_main() -> int:
    return main(["optimizer", *sys.argv[1:]])


def rollout_main() -> int:
    return main(["rollout", *sys.argv[1:]])


def league_main() -> int:
    return main(["league", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
