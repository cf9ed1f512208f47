"""The commands that take a trained policy out of its run: `rapid export`, `rapid play`, `rapid watch`.

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


COMMANDS = {"export": cmd_export, "play": cmd_play, "watch": cmd_watch}
