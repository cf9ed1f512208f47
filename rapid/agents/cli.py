"""The commands that take a trained policy out of its run: `rapid export`, `rapid play`, `rapid watch`, `rapid replay`.

Their parsers join the `rapid` command (``add_parsers``) and their mains its command table (``COMMANDS``); each
main imports its module when it runs, so `rapid --help` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rapid.api import run_dir_config
from rapid.errors import UsageError


def add_parsers(sub, run_dir_arg: Callable) -> None:
    p = sub.add_parser(
        "export", help="write a policy as one file for torch alone (TorchScript) or onnxruntime alone (ONNX)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write a published version as a standalone policy: the observation normalizer and the LSTM "
                    "state handling built in (inputs obs, mask, h, c, first; outputs actions, logp, value, h, c; "
                    "see rapid/agents/export.py).",
        epilog="examples:\n"
               "  rapid export --run-dir runs/c4 --format torchscript --out c4.pt\n"
               "  rapid export --run-dir runs/moba --version v120 --format onnx --out moba.onnx\n"
               "  rapid export --run-dir runs/c4 --format reference --out configs/ladder/c4-mine.rpm")
    run_dir_arg(p, required=True)
    p.add_argument("--version", default="latest", help="params version: latest, 12 or v12 (default latest)")
    p.add_argument("--format", choices=("torchscript", "onnx", "reference"), default="torchscript",
                   help="torchscript (runs with torch alone), onnx (with onnxruntime alone) or reference (a frozen "
                        "policy for a strength ladder: eval.ladder's ref:PATH); default torchscript")
    p.add_argument("--out", required=True, help="the file to write")

    p = sub.add_parser("play", help="play connect four, tictactoe… against a run's policy in the terminal")
    run_dir_arg(p, required=True)
    p.add_argument("--version", default="latest", help="params version: latest, 12 or v12 (default latest)")
    p.add_argument("--agent-first", action="store_true", help="the agent moves first (default: you do)")
    p.add_argument("--sample", action="store_true", help="the agent samples its moves (default: its most likely)")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("watch", help="a local web page showing a moba match of a run's policy as it is played")
    run_dir_arg(p, required=True)
    p.add_argument("--version", default="latest", help="params version on blue: latest, 12 or v12 (default latest)")
    p.add_argument("--against", default="lane", help="red: a bot (random, idle, lane) or a version (default lane)")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0: any free port)")
    p.add_argument("--speed", type=float, default=1.0, help="× game time (default 1; the page changes it)")
    p.add_argument("--greedy", action="store_true", help="policies play their most likely action (default: sample)")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser(
        "replay", help="write an animated GIF of one moba match", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Play one moba game, the first PLAYER on side 0 (blue, left), and write it as an animated GIF.",
        epilog="examples:\n"
               "  rapid replay lane random --out lane-vs-random.gif\n"
               "  rapid replay --run-dir runs/moba-3v3 latest lane --greedy --frame-every 2 --out team.gif")
    run_dir_arg(p)
    p.add_argument("players", nargs=2, metavar="PLAYER",
                   help="bot name (random, idle, lane), or with --run-dir a params version (latest, 120, v120)")
    p.add_argument("--out", default="replay.gif", help="output GIF (default replay.gif)")
    p.add_argument("--seed", type=int, default=0, help="game and bot seed (default 0)")
    p.add_argument("--max-steps", type=int, help="stop after this many steps (default: the game's time limit)")
    p.add_argument("--greedy", action="store_true", help="policies play their most likely action (default: sample)")
    p.add_argument("--frame-every", type=int, default=1, metavar="K",
                   help="draw every K-th step (default 1; 2 or 3 keep a long game's GIF small)")
    p.add_argument("--fps", type=float, default=10.0, help="frames per second of the GIF (default 10)")


def cmd_export(args) -> int:
    from rapid.agents.export import describe_file, export_policy
    from rapid.api import load_policy

    trained = load_policy(args.run_dir, args.version)
    if args.format == "reference":
        from rapid.run.ladder_rungs import write_reference

        path = write_reference(args.out, trained.model.tensors(), trained.config, trained.version,
                               note=f"{args.run_dir} v{trained.version}")
        print(f"wrote {path}: v{trained.version} of {trained.config.run.name} ({trained.env_name}) as a ladder "
              f"reference; add it to a config's [eval.ladder] as \"ref:{path}\" (rapid eval --ladder --calibrate "
              "rates it)")
        return 0
    path = export_policy(trained, args.format, args.out)
    print(describe_file(path))
    return 0


def cmd_play(args) -> int:
    from rapid.agents.play import play_game
    from rapid.api import load_policy

    play_game(load_policy(args.run_dir, args.version), agent_first=args.agent_first, greedy=not args.sample,
              seed=args.seed)
    return 0


def cmd_watch(args) -> int:
    from rapid.agents.watch import watch

    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port}: use 0 to 65535")
    return watch(run_dir_config(args.run_dir), args.version, args.against, port=args.port, speed=args.speed,
                 seed=args.seed, greedy=args.greedy)


def cmd_replay(args) -> int:
    from rapid.agents.replay import write_replay
    from rapid.envs.moba import MobaVecEnv
    from rapid.roles.startup import open_run_store
    from rapid.run.config_files import load_config
    from rapid.run.matches import make_player
    from rapid.run.param_store import ParameterStore

    cfg = run_dir_config(args.run_dir) if args.run_dir else load_config(None, ["env.name=moba"])
    if cfg.env.name != "moba":
        raise UsageError(f"rapid replay draws moba games; this run plays {cfg.env.name}")
    env = MobaVecEnv(num_games=1, seed=args.seed, **cfg.env.options)
    bots = env.bot_names()
    if not args.run_dir and any(p not in bots for p in args.players):
        raise UsageError(f"without --run-dir only bots can play ({', '.join(bots)})")
    if args.frame_every < 1 or args.fps <= 0:
        raise UsageError("rapid replay: --frame-every must be ≥ 1 and --fps > 0")
    players = list(args.players)
    if args.run_dir:
        params = ParameterStore(open_run_store(cfg))
        players = [p if p in bots else make_player(p, cfg, env, params, seed=args.seed, greedy=args.greedy)
                   for p in players]
    result = write_replay(cfg.env.options, players, args.out, seed=args.seed, max_steps=args.max_steps,
                          fps=args.fps, frame_every=args.frame_every)
    print(f"wrote {args.out}: {args.players[0]} vs {args.players[1]}, {replay_outcome(result, args.players)}")
    return 0


def replay_outcome(result, players: list[str]) -> str:
    """How a replayed game ended, in words: who won and whether the base fell or the clock ran out."""
    if result is None:
        return "cut at --max-steps"
    how = "at the time limit" if result.truncated else "before the time limit"
    if result.winner < 0:
        return f"a draw {how} after {result.length} steps"
    return f"won by {players[result.winner]} {how} after {result.length} steps"


COMMANDS = {"export": cmd_export, "play": cmd_play, "watch": cmd_watch, "replay": cmd_replay}
