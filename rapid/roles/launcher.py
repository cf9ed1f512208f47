"""`rapid train`: the same roles as processes on one machine, a live progress line, a summary at the end.

The launcher starts the optimizer, N rollout workers and the evaluator as child processes of their own
(so Ctrl-C reaches only the launcher, which then stops them in order: workers first, the optimizer last,
after its final checkpoint). Children also get SIGTERM if the launcher itself dies, so none is orphaned.
A role that dies is restarted: a worker, the inference server or the evaluator at once, the optimizer from its
newest checkpoint (``--resume auto``) after a back-off, at most ``run.max_restarts`` times in a row
(:mod:`rapid.roles.restarts`); the other roles keep running meanwhile.

With ``in_process`` (`rapid train --in-process`) the same role mains run as threads of the launcher's process
instead, sharing one stop flag, their logs in ``logs/in-process.log``, experience decoded inline (no decode
worker processes): one process a debugger can follow from the env to the gradient, and fast tests. Progress,
restarts and the summary are the same.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rapid.errors import FormatError, UsageError
from rapid.infra.identity import usable_cpus
from rapid.infra.store import StoreError
from rapid.monitoring.metrics import LauncherMetrics
from rapid.optimizer.decode_pool import auto_workers
from rapid.roles.box_plan import BoxPlan, cpu_sets, describe, plan_box
from rapid.roles.restarts import EXPLOITED, RestartPolicy
from rapid.roles.start_point import Resume
from rapid.roles.startup import StopFlag, check_run_dir, log_to_file, open_run_store, rollout_seed, start_metrics
from rapid.rollout.inference import inference_mode
from rapid.run.config import Config
from rapid.run.config_files import to_toml
from rapid.run.ladder_rungs import check_ladder
from rapid.run.param_store import ParameterStore
from rapid.run.progress import Launch, Progress, RunLogs, final_summary
from rapid.run.restart_summary import Death

PR_SET_PDEATHSIG = 1


def _die_with_parent(cpus: frozenset[int] | None = None) -> None:
    """In the child before exec: get SIGTERM when the launcher dies (Linux), and run on ``cpus`` if given (its
    children inherit them: an optimizer's decode processes)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
    os.setsid()
    if cpus:
        os.sched_setaffinity(0, cpus)


@dataclass
class Child:
    role: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)
    cpus: frozenset[int] | None = None
    """The cores its process runs on (None: the launcher's)."""

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "rapid.cli", *self.args], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=functools.partial(_die_with_parent, self.cpus))
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    def stop(self, reason: str = "launcher") -> None:
        """SIGTERM (the process logs the signal as its reason)."""
        if self.proc is not None and self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def stopped_by(self) -> str:
        """Why the role stopped by itself, where a process can tell ('' here: its log says)."""
        return ""

    def wait(self, timeout: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class ThreadRole:
    """A role main on a thread of the launcher's process; every role shares the launcher's stop flag."""

    role: str
    main: Callable[[], int]
    log_path: Path
    flag: StopFlag
    thread: threading.Thread | None = None
    returncode: int | None = None
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.returncode = None
        self.thread = threading.Thread(target=self._run, name=self.role, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        log = logging.getLogger(f"rapid.{self.role}")
        try:
            self.returncode = self.main()
        except UsageError as e:  # what the role's process would print before exiting 2
            log.error("%s", e)
            self.returncode = 2
        except Exception:  # a process would die with this traceback: log it, the launcher restarts the role
            log.exception("%s failed", self.role)
            self.returncode = 1

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def stop(self, reason: str = "launcher") -> None:
        self.flag.set(reason)

    def stopped_by(self) -> str:
        """Why the role stopped by itself (``run.updates`` reached: 'updates'), from its stop flag."""
        return self.flag.reason if self.flag else ""

    def wait(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)


def box_plan(cfg: Config) -> BoxPlan:
    """How this machine's cores are shared when run.num_workers is 0 (see :mod:`rapid.roles.box_plan`)."""
    import torch

    cores, gpu = usable_cpus(), torch.cuda.is_available()
    decoders = cfg.optimizer.decode_workers if cfg.optimizer.decode_workers >= 0 else auto_workers(cores)
    return plan_box(cores, gpu, _node_inference(cfg)[0], decoders, cfg.eval.interval_s > 0)


def default_workers() -> int:
    """Rollout workers when run.num_workers is 0 on a machine without GPU: one per core this process may use, less
    the optimizer's."""
    return plan_box(usable_cpus(), False, False, 0, False).workers


def holds_run(run_dir: Path, store: Path | None = None) -> bool:
    """Whether a run directory's local store (or ``store``) holds a run (published parameters)."""
    params = (run_dir / "store" if store is None else store) / "params"
    return params.is_dir() and any(params.iterdir())


def prepare_run_dir(cfg: Config, resume: bool) -> Path:
    run_dir = Path(cfg.derive().run_dir)
    has_params = holds_run(run_dir, Path(cfg.derive().store_url) if cfg.pbt.member >= 0 else None)  # a member's
    if resume and not has_params:
        raise UsageError(f"--resume: {run_dir} holds no run to resume")
    if not resume and has_params:
        raise UsageError(f"{run_dir} already holds a run: add --resume to continue it, or pick another --run-dir")
    check_run_dir(cfg)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(cfg))
    return run_dir


def _node_inference(cfg: Config) -> tuple[bool, Config]:
    """Whether this machine's workers decide through a node inference server, and the workers' config: the
    launcher runs the server itself (and restarts it if it dies), so no worker starts one."""
    import torch

    if inference_mode(cfg.rollout.inference, torch.cuda.is_available(), usable_cpus()) != "node":
        return False, cfg
    return True, dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, inference_spawn=False))


def _processes(cfg: Config, run_dir: Path, workers: int, seed_offset: int, stop: StopFlag,
               cpus: dict[str, frozenset[int]] | None = None):
    """The optimizer (a function of how it starts: a restart resumes), then the node's inference server (node
    inference), the rollout workers and the evaluator, as child processes; each on its role's ``cpus`` if given."""
    config_path, logs = str(run_dir / "config.toml"), run_dir / "logs"
    on = (cpus or {}).get
    # Pinned, the optimizer would count only its own cores: it runs the decode processes its cores were kept for.
    decoders = ["--set", f"optimizer.decode_workers={len(cpus['optimizer']) - 1}"] if cpus else []

    def optimizer(resume: Resume) -> Child:
        how = {False: [], True: ["--resume"], "auto": ["--resume", "auto"]}[resume]
        return Child("optimizer", ["optimizer", "--config", config_path, *how, *decoders], logs / "optimizer.log",
                     cpus=on("optimizer"))

    node, _ = _node_inference(cfg)
    servers = [Child("inference", ["inference", "--config", config_path], logs / "inference.log",
                     cpus=on("inference"))] if node else []
    no_spawn = ["--set", "rollout.inference_spawn=false"] if node else []
    rollouts = [Child(f"rollout-{i}", ["rollout", "--config", config_path, "--worker-id", f"w{i}",
                                       "--seed", str(rollout_seed(cfg.run.seed, f"w{i}", i) + seed_offset),
                                       *no_spawn], logs / f"rollout-{i}.log", cpus=on("rollout"))
                for i in range(workers)]
    evaluator = [Child("evaluator", ["evaluator", "--config", config_path], logs / "evaluator.log",
                       cpus=on("evaluator"))]
    return optimizer, servers, rollouts, evaluator


def _threads(cfg: Config, run_dir: Path, workers: int, seed_offset: int, stop: StopFlag,
             cpus: dict[str, frozenset[int]] | None = None):
    """The same roles as threads of this process, each running its role main with the shared stop flag but the
    optimizer, whose flag is its own (one that fails sets it, and must not stop the others while it restarts)."""
    from rapid.roles.evaluator import run_evaluator
    from rapid.roles.inference import run_inference_server
    from rapid.roles.optimizer import run_optimizer
    from rapid.roles.rollout import run_rollout

    log = run_dir / "logs" / "in-process.log"
    log_to_file(log)
    # One process means one: the optimizer decodes experience inline instead of in worker processes.
    cfg = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, decode_workers=0))

    def optimizer(resume: Resume) -> ThreadRole:
        flag = StopFlag(install_signals=False)
        return ThreadRole("optimizer", lambda: run_optimizer(cfg, resume=resume, stop=flag), log, flag)
    node, worker_cfg = _node_inference(cfg)
    # The server has a stop flag of its own: it stops after the workers (a Ctrl-C reaches only the shared one).
    server_stop = StopFlag(install_signals=False)
    server = ThreadRole("inference", lambda: run_inference_server(cfg, stop=server_stop, idle_s=0), log, server_stop)
    servers = [server] if node else []
    rollouts = [ThreadRole(f"rollout-{i}", functools.partial(
        run_rollout, worker_cfg, f"w{i}", rollout_seed(cfg.run.seed, f"w{i}", i) + seed_offset, stop=stop, rank=i),
        log, stop) for i in range(workers)]
    evaluator = [ThreadRole("evaluator", lambda: run_evaluator(cfg, stop=stop), log, stop)]
    return optimizer, servers, rollouts, evaluator


def target_reached(cfg: Config, logs: RunLogs) -> str:
    """Why the run stops at ``run.target_win_rate`` ('' while it goes on): the newest evaluation of the rated mode
    (``eval.play``'s first: sampled when both are played) reached it."""
    rated = cfg.eval.modes[0]
    last = logs.last_eval(rated)
    if not cfg.run.target_win_rate or last is None or last["win_rate"] < cfg.run.target_win_rate:
        return ""
    return f"target win rate {cfg.run.target_win_rate:g} reached by v{last['version']}" + (
        " (greedy)" if rated == "greedy" else "")


def _launch(cfg: Config, resume: bool, started: float) -> Launch:
    """This launch for the summary: a fresh run starts from version 0, a resumed one after the store's newest
    (None when it cannot be read: the summary then leaves the first version out)."""
    if not resume:
        return Launch(started)
    try:
        version = ParameterStore(open_run_store(cfg)).latest_version()
    except (UsageError, StoreError, FormatError):
        version = None
    return Launch(started, resumed=True, version=version)


@dataclass
class TrainOutcome:
    exit_code: int
    """0 for a clean stop; 1 when the optimizer failed."""
    summary: str


def fresh_run_dir(name: str) -> str:
    """runs/<name>, or runs/<name>-2, -3… when taken: a run with no directory asked for never lands in another's."""
    candidate, k = Path("runs") / name, 1
    while candidate.exists():
        k += 1
        candidate = Path("runs") / f"{name}-{k}"
    return candidate.as_posix()


def run_train(cfg: Config, resume: bool = False, show_progress: bool = True, in_process: bool = False,
              echo: bool = True, started: float | None = None) -> TrainOutcome:
    """Every role on this machine until a stop; ``echo`` prints the opening line and the summary (`rapid train`).
    ``started``: when the command began (`rapid train` stamps it before its imports), else now; the summary's first
    minutes count from there."""
    launched = time.time() if started is None else started
    check_ladder(cfg)
    run_dir = prepare_run_dir(cfg, resume)
    launch = _launch(cfg, resume, launched)
    logs = run_dir / "logs"
    plan = None if cfg.run.num_workers else box_plan(cfg)
    workers = plan.workers if plan is not None else cfg.run.num_workers
    stop = StopFlag()
    # A resumed run plays new games: its workers' seeds differ from the first run's.
    seed_offset = int(time.time()) if resume else 0
    pinned = None if plan is None or in_process or not hasattr(os, "sched_getaffinity") else cpu_sets(
        plan, sorted(os.sched_getaffinity(0)))
    make_optimizer, servers, rollouts, evaluator = (_threads if in_process else _processes)(
        cfg, run_dir, workers, seed_offset, stop, pinned)
    helpers = rollouts + (evaluator if cfg.eval.interval_s > 0 else [])
    metrics = start_metrics(LauncherMetrics, cfg)
    run_logs = RunLogs(run_dir)
    progress = Progress(run_logs, enabled=show_progress)
    if echo:
        print(f"rapid train: run {cfg.run.name} in {run_dir} — {workers} rollout worker(s) × {cfg.env.num_games} games "
              f"of {cfg.env.name}{', as threads of one process' if in_process else ''}; logs in {logs}; "
              "Ctrl-C stops cleanly", flush=True)
        if plan is not None:
            print(f"rapid train: {plan.line()} (run.num_workers = 0; set it to choose)", flush=True)
        if pinned is not None:
            print(f"rapid train: each role on its own cores: {describe(pinned)}", flush=True)
    started = time.time()
    optimizer = make_optimizer(resume)
    optimizer.start()
    restarts, deaths = RestartPolicy(cfg.run.max_restarts), list[Death]()
    restarts.started(started)
    for child in servers + helpers:
        child.start()
    reason = "optimizer exited"
    try:
        while True:
            if not optimizer.alive():
                code = optimizer.returncode
                verdict = restarts.after_exit(code if code is not None else 1, time.time())
                if not verdict.restart:
                    why = optimizer.stopped_by()
                    reason = verdict.line or (f"stopped by {why}" if why else reason)
                    break
                if verdict.failure:
                    deaths.append(Death(time.time(), code if code is not None else 1))
                    metrics.restart("optimizer")
                progress.note(f"{verdict.line} (see {optimizer.log_path})")
                if stop.wait(verdict.delay_s):
                    reason = f"stopped by {stop.reason}"
                    break
                optimizer = make_optimizer("auto")  # resumes the run, or starts it if it died before version 0
                optimizer.start()
                restarts.started(time.time())
            if stop.wait(1.0):
                reason = f"stopped by {stop.reason}"
                break
            if cfg.run.minutes and time.time() - started >= 60 * cfg.run.minutes:
                reason = f"time limit ({cfg.run.minutes:g} min)"
                break
            run_logs.refresh()
            reached = target_reached(cfg, run_logs)
            if reached:
                reason = reached
                break
            for child in servers + helpers:
                if not child.alive() and child.returncode not in (0, None):
                    child.exit_codes.append(child.returncode)
                    child.restarts += 1
                    metrics.restart(child.role.split("-")[0])
                    progress.note(f"{child.role} exited with code {child.returncode}; restarting "
                                  f"(see {child.log_path})")
                    child.start()
            metrics.processes_alive("rollout", sum(c.alive() for c in rollouts))
            metrics.processes_alive("optimizer", int(optimizer.alive()))
            progress.update()
    finally:
        for child in helpers:
            child.stop()
        optimizer.stop(stop.reason if stop else "launcher")  # in process: its own flag gets the run's reason
        for child in helpers:
            child.wait(30)
        for server in servers:  # after the workers, which would otherwise lose it mid-step
            server.stop()
            server.wait(30)
        optimizer.wait(120)
        progress.close()
        metrics.close()
    code = optimizer.returncode
    summary = final_summary(run_dir, reason, time.time() - started, code, launch, deaths)
    if echo:
        print(summary)
    if code not in (0, -signal.SIGTERM, EXPLOITED):  # EXPLOITED: a member copies its leader when resumed
        print(f"rapid train: the optimizer failed (exit code {code}); see {optimizer.log_path}", file=sys.stderr)
        return TrainOutcome(1, summary)
    return TrainOutcome(0, summary)
