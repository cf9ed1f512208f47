"""What the docs show, the code accepts: every `rapid …`, `rapid-optimizer …`, `rapid-rollout …`, `rapid-league …`
and `python benchmarks/… ` command line in README.md and docs/*.md goes through the real argument parser (nothing
runs), and every dotted config field the docs name (`--set a.b=…`, or `optimizer.target_reuse` in prose) is a
field of the typed config (`env.options.*` of the env's typed options). A renamed flag or field fails here.

A command in a code block must parse whole; one inline in prose may leave out required arguments (`rapid league
pin` names the command), but every command word and option it shows must exist.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import re
import shlex
import sys
import tomllib
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from unittest import mock

import pytest

from rapid.cli import build_parser
from rapid.envs.registry import options_type
from rapid.run.config import Config

ROOT = Path(__file__).resolve().parents[1]
# docs/benchmarks-history.md keeps superseded figures with the commands of their day: history, not a claim.
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md",
        *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks-history.md")]
# Console scripts (pyproject.toml) and the `rapid` command words each one stands for.
PROGRAMS = {"rapid": [], "rapid-optimizer": ["optimizer"], "rapid-rollout": ["rollout"], "rapid-league": ["league"]}
LAUNCHERS = {"mpiexec", "mpirun", "srun", "torchrun"}
SECTIONS = {f.name: typing.get_type_hints(Config)[f.name] for f in dataclasses.fields(Config)}
# env.options.* named without an env (`rapid eval --run-dir runs/moba --set env.options.…`, prose) are moba's:
# the one built-in env whose options are typed.
DEFAULT_OPTIONS_ENV = "moba"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
FIELD = r"(?:" + "|".join(SECTIONS) + r")\.[a-z_]+(?:\.[a-z_]+)?"
# A field in prose: not part of a path or a longer name (`rapid/roles/rollout.py`, `run_store.py`).
PROSE_FIELD = re.compile(rf"(?<![\w/.-])({FIELD})(?![\w(])")
SET_VALUE = re.compile(rf"({FIELD})=")
# `optimizer.py`, `logs/optimizer.jsonl`: file names, not fields.
FILE_SUFFIXES = {"py", "jsonl", "json", "toml", "log", "md", "yml", "yaml", "png", "gif"}
COMMAND_WORDS = sorted(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)


@dataclass
class Command:
    where: str
    argv: list[str]
    """From the program on: ["rapid", "train", …] or ["python", "benchmarks/x.py", …]."""
    whole: bool
    """A code block's line (must parse whole), not an inline mention."""


def snippets(text: str) -> list[tuple[int, str, bool]]:
    """(line, text, in a code block) of every code block line and inline code span."""
    found = []
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start()) + 2
        for i, line in enumerate(m.group(1).replace("\\\n", " ").splitlines()):
            found.append((first + i, line, True))
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in SPAN.finditer(prose):  # a span may wrap over lines: one space for each break
        found.append((prose.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()), False))
    return found


def command_of(line: str) -> list[str] | None:
    """The command line a snippet shows, from its program to the first shell operator or comment; None if it
    shows none. Leading VAR=value assignments and an MPI/Slurm launcher are skipped, `[…]` optional parts kept."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:  # an unclosed quote: not a command line
        return None
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        tokens.pop(0)
    if tokens and tokens[0] in LAUNCHERS:
        tokens = next((tokens[i:] for i, t in enumerate(tokens) if t in PROGRAMS), [])
    if tokens[:1] == ["python"] and tokens[1:2] and tokens[1].startswith("benchmarks/"):
        start = 2
    elif tokens[:1] and tokens[0] in PROGRAMS:
        start = 1
    else:
        return None
    argv, optional = tokens[:start], False
    for token in tokens[start:]:
        if token.startswith("#") or re.fullmatch(r"[|&;<>()]+", token):
            break
        if token.startswith("[-"):  # "[--store URL]": an optional part, parsed as if given
            token, optional = token[1:], True
        if optional and token.endswith("]"):
            token, optional = token[:-1], False
        if token != "…":  # "rapid-rollout …": more arguments
            argv.append(token)
    return argv


def commands(text: str, name: str) -> list[Command]:
    found = []
    for line, snippet, whole in snippets(text):
        argv = command_of(snippet)
        # A bare program name in prose names the program (`rapid`), it is no command line.
        if not argv or not (whole or len(argv) > 1):
            continue
        # `rapid COMMAND --help` stands for each command.
        for word in COMMAND_WORDS if argv[1:2] == ["COMMAND"] else [None]:
            found.append(Command(f"{name}:{line}", argv if word is None else [argv[0], word, *argv[2:]], whole))
    return found


def relaxed(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser for a mention: nothing required, an option's value optional and untyped (`--settle-updates N`),
    so unknown command words and options still fail but missing arguments and metavariables do not."""
    for action in parser._actions:
        action.required = False
        action.type = None
        if action.option_strings and action.nargs is None:
            action.nargs = "?"
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                relaxed(sub)
    for group in parser._mutually_exclusive_groups:
        group.required = False
    return parser


@cache
def rapid_parser(whole: bool) -> argparse.ArgumentParser:
    return build_parser() if whole else relaxed(build_parser())


@cache
def benchmark_module(script: str):
    path = ROOT / script
    spec = importlib.util.spec_from_file_location(f"_docs_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there while the module runs
    sys.path.insert(0, str(path.parent))  # as `python benchmarks/x.py` would (bench_fleet imports `fleet`)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


class _Parsed(Exception):
    pass


def parse_error(cmd: Command) -> str | None:
    """The parser's one-line error for this command line, or None when it parses."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(io.StringIO()):
            if cmd.argv[0] in PROGRAMS:
                rapid_parser(cmd.whole).parse_args([*PROGRAMS[cmd.argv[0]], *cmd.argv[1:]])
            else:
                parse_benchmark(cmd)
    except SystemExit as e:
        if e.code:  # --help exits 0
            return out.getvalue().strip().splitlines()[-1] if out.getvalue().strip() else f"exit {e.code}"
    except FileNotFoundError as e:
        return str(e)
    return None


def parse_benchmark(cmd: Command) -> None:
    """A benchmark builds its parser in main() and parses first thing: stop main() right after its parse."""
    script, args = cmd.argv[1], cmd.argv[2:]
    if not (ROOT / script).is_file():
        raise FileNotFoundError(f"{script}: no such benchmark")
    module = benchmark_module(script)
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, argv=None, namespace=None):
        raise _Parsed(parse(parser if cmd.whole else relaxed(parser), argv, namespace))

    with mock.patch.object(sys, "argv", [Path(script).name, *args]), \
            mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop):
        try:
            module.main()
        except _Parsed:
            return
    raise AssertionError(f"{script}: main() returned without parsing its arguments")


def field_error(path: str, env: str) -> str | None:
    """Why `path` (section.key or env.options.key) is no field of the typed config; None when it is one."""
    section, key, *rest = path.split(".")
    fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
    if key not in fields:
        return f"{path}: no field {key!r} in [{section}]"
    if (section, key) == ("env", "options") and rest:
        typed = options_type(env)
        if typed is None:
            return f"{path}: env {env} declares no options type"
        if rest[0] not in {f.name for f in dataclasses.fields(typed)}:
            return f"{path}: no option {rest[0]!r} of {env}"
    elif rest:
        return f"{path}: [{section}] {key} has no fields"
    return None


def env_of(argv: list[str]) -> str:
    """The env a command line runs: its --set env.name, else its --config file's, else moba's options."""
    sets = [v for flag, v in zip(argv, argv[1:]) if flag in ("--set", "-s")]
    for value in reversed(sets):
        if value.startswith("env.name="):
            return value.split("=", 1)[1].strip("\"'")
    for flag, value in zip(argv, argv[1:]):
        if flag in ("--config", "-c") and (ROOT / value).is_file():
            return tomllib.loads((ROOT / value).read_text()).get("env", {}).get("name", Config().env.name)
    return DEFAULT_OPTIONS_ENV


def command_problems(cmd: Command) -> list[str]:
    problems = []
    if (error := parse_error(cmd)) is not None:
        problems.append(error)
    env = env_of(cmd.argv)
    for flag, value in zip(cmd.argv, cmd.argv[1:]):
        if flag in ("--set", "-s"):
            m = SET_VALUE.match(value)
            problems.append(field_error(m.group(1), env) if m else f"--set {value}: no config section")
        if flag in ("--config", "-c") and value.startswith("configs/") and not (ROOT / value).is_file():
            problems.append(f"{value}: no such config file")
    return [f"{cmd.where}: {' '.join(cmd.argv)}: {p}" for p in problems if p]


def prose_fields(text: str) -> list[tuple[int, str]]:
    """(line, field) of the config fields named in inline code that is no command line (`optimizer.target_reuse`,
    `metrics.addr = "0.0.0.0"`, `runs/<run.name>`, `--set ppo.lr=1e-4`)."""
    return [(line, m.group(1)) for line, snippet, whole in snippets(text) if not whole and not command_of(snippet)
            for m in PROSE_FIELD.finditer(snippet) if m.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES]


def prose_field_problems(text: str, name: str) -> list[str]:
    return [f"{name}:{line}: {error}" for line, path in prose_fields(text)
            if (error := field_error(path, DEFAULT_OPTIONS_ENV))]


def doc_problems(text: str, name: str) -> list[str]:
    return [p for cmd in commands(text, name) for p in command_problems(cmd)] + prose_field_problems(text, name)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_and_config_field_in_the_docs_exists(doc):
    assert doc_problems(doc.read_text(), doc.name) == []


def test_the_docs_show_commands_of_every_program_and_name_fields():
    """The extraction finds what the docs hold (a pattern that matched nothing would pass everything)."""
    shown = {c.argv[0] if c.argv[0] in PROGRAMS else c.argv[1] for d in DOCS for c in commands(d.read_text(), "")}
    assert set(PROGRAMS) | {"benchmarks/bench_learning.py"} <= shown, shown
    named = {path for d in DOCS for _, path in prose_fields(d.read_text())}
    assert {"optimizer.target_reuse", "optimizer.max_reuse", "metrics.addr", "run.name"} <= named, named


BROKEN = """
```sh
rapid train --minuts 3                                     # a renamed flag
mpiexec -n 4 rapid-optimizer --config run.toml --set optimizer.target_reus=3.0
rapid eval --run-dir runs/moba --set env.options.fountain_heel=0.1 | tee out
python benchmarks/bench_learning.py moba --seedz 0
rapid train --config configs/no-such.toml
```
Prose: `rapid leage ls`, `rapid eval --versoin 3`, `optimizer.max_reuses`, `--set ppo.lrate=1e-4`.
Fine: `rapid league pin`, `rapid eval --version`, `optimizer.target_reuse`, `env.options.fountain_heal`.
"""


def test_a_renamed_flag_or_field_fails():
    problems = doc_problems(BROKEN, "broken.md")
    expected = [
        ("broken.md:3: rapid train --minuts 3", "unrecognized arguments: --minuts"),
        ("broken.md:4: rapid-optimizer --config run.toml", "optimizer.target_reus: no field 'target_reus'"),
        ("broken.md:5: rapid eval --run-dir runs/moba", "env.options.fountain_heel: no option 'fountain_heel' of moba"),
        ("broken.md:6: python benchmarks/bench_learning.py moba --seedz 0", "unrecognized arguments: --seedz"),
        ("broken.md:7: rapid train --config configs/no-such.toml", "configs/no-such.toml: no such config file"),
        ("broken.md:9: rapid leage ls", "invalid choice: 'leage'"),
        ("broken.md:9: rapid eval --versoin 3", "unrecognized arguments: --versoin"),
        ("broken.md:9: optimizer.max_reuses", "no field 'max_reuses' in [optimizer]"),
        ("broken.md:9: ppo.lrate", "no field 'lrate' in [ppo]"),
    ]
    for start, message in expected:
        assert any(p.startswith(start) and message in p for p in problems), (start, message, problems)
    assert len(problems) == len(expected), problems
