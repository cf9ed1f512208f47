"""Typed run configuration: one dataclass per section, every field documented below it (`rapid config show --doc`
prints them all), and the sizes derived from them computed in one place (:meth:`Config.derive`). Reading a config
from TOML and ``section.key=value`` overrides, with every error reported together, is :mod:`rapid.run.config_files`.

>>> cfg = Config(ppo=PPOConfig(lr=3e-4, horizon_s=50))
>>> cfg.ppo.lr, cfg.derive(seconds_per_step=1.0).gamma
(0.0003, 0.98)
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from rapid.infra.dist_context import DEFAULT_TIMEOUT_S
from rapid.opt.config import PPOConfig
from rapid.run.pbt_config import PbtConfig, member_folder


@dataclass
class RunConfig:
    name: str = "run"
    """Run name: labels metrics and names the default run directory."""
    dir: str = ""
    """Local run directory (config, logs, metrics registrations; the store too unless store.url is set). Empty:
    runs/<name>, or runs/<name>-<8 hex digits of store.url> when store.url is set, so runs on different
    stores never share one."""
    seed: int = 0
    """Base seed; each worker and rank derives its own from it."""
    minutes: float = 0.0
    """Stop training after this many minutes of this invocation: a --resume gets them afresh (0: no limit)."""
    updates: int = 0
    """Stop training once the run has made this many optimizer updates in all, counted across --resume (0: no
    limit): a resumed run that has them already stops at once."""
    target_win_rate: float = 0.0
    """`rapid train` stops once the evaluator's win rate against eval.opponent reaches this (0: never);
    rapid-optimizer ignores it: a cluster run stops at run.updates or run.minutes."""
    num_workers: int = 0
    """Rollout worker processes for `rapid train` (0: one per core this process may use, as taskset or a
    container's cpuset leaves it, less the optimizer's, and on a GPU box less a core each for its decode processes,
    the inference server and the evaluator, every role then pinned to its cores on Linux; at least 1)."""
    max_restarts: int = 3
    """`rapid train` restarts an optimizer that died (a signal, an out-of-memory kill, an unexpected error) from
    its newest checkpoint, waiting 1, 2, 4 … s (at most 30 s) first, at most this many times in a row; a restart
    that then trains for 10 minutes clears the count. Past it the run stops with the command to resume (0: never
    restart). Clusters restart their optimizer job themselves (docs/reliability.md)."""


@dataclass
class EnvConfig:
    name: str = "pettingzoo.classic.connect_four_v3"
    """'moba' or a PettingZoo module path."""
    num_games: int = 64
    """Games stepped together by each rollout worker (B)."""
    options: dict[str, Any] = field(default_factory=dict)
    """The game's options (keyword arguments of its constructor), checked at load against the options type the
    env declares: for moba, :class:`rapid.envs.moba.MobaConfig`; `rapid config show --doc` lists them."""


@dataclass
class ModelConfig:
    hidden: int = 128
    """Width of the observation encoder's layers."""
    encoder_layers: int = 2
    """Fully connected layers before the LSTM."""
    conv_channels: list[int] = field(default_factory=list)
    """Channels of the 3×3 convolutions that encode a grid observation (board games, images: the env says
    so) before the fully connected layers; other envs ignore it. Empty: fully connected only (as every run
    before this option, so their run dirs still resume); configs/default.toml uses [16, 32]."""
    lstm: int = 128
    """LSTM hidden size (per agent)."""


@dataclass
class RolloutConfig:
    bptt: int = 16
    """Decisions of one agent per sample (truncated BPTT length): in a turn-based game its own turns."""
    samples_per_segment: int = 4
    """GAE runs over each agent's segments of bptt × samples_per_segment decisions before they are cut into
    samples; a worker also plays bptt × samples_per_segment steps between parameter checks."""
    upload_interval_s: float = 60.0
    """Seconds between experience uploads (Rapid: 60)."""
    warmup_upload_interval_s: float = -1.0
    """Seconds between experience uploads while the version played is the warm-up's (ppo.warmup_updates), so
    that the warm-up trains on fresher experience (negative: upload_interval_s)."""
    param_poll_s: float = 5.0
    """Seconds between polls for a newer parameter version."""
    max_backlog: int = 8
    """Experience objects held while the store is unreachable; the oldest are dropped past this."""
    max_backlog_mb: int = 256
    """Megabytes of encoded experience held while the store is unreachable; the oldest go past this."""
    worker_id: str = ""
    """Worker name in keys and metrics (empty: RAPID_WORKER_ID, '-<rank>' added when several ranks share it;
    else 'w<rank>' under MPI or Slurm; else 'w<pid>')."""
    node_cache_dir: str = ""
    """Folder the rollout processes of a node share, so a version, a snapshot or the pool is fetched once per
    node ('': <run dir>/node-cache; 'off': every process reads the store itself). It must be local to the node
    and shared by its rollout processes, never on a shared file system."""
    torch_threads: int = 1
    """Torch CPU threads of a rollout worker (workers scale by process, not by thread)."""
    linger_s: float = 300.0
    """Once the run's optimizer has stopped (its lease released, or expired: it died), a worker plays no more
    games and waits this many seconds for an optimizer to take the run again (a --resume), then stops (0: at
    once). It asks only when no new version has come for a few publish intervals (and once at start); while it
    waits it asks again after 1 s, 2 s, 4 s, … then every 30 s, so a --resume, whose optimizer takes the run a
    moment after its workers start, loses no more than a second or two."""
    inference: str = "auto"
    """Where the policy runs: 'local' (on each worker's core), 'node' (one inference server per node batches every
    worker's requests, on the node's GPU if it has one, and is the node's only reader of parameters), 'auto' (node
    where a GPU is visible and the worker may use at least 10 cores, one of them the server's; else local:
    rapid.rollout.inference.NODE_MIN_CORES, from BENCHMARKS.md's node-against-local figures)."""
    inference_lanes: int = 2
    """With node inference: groups a worker's games split into (env.num_games must divide), one stepping while
    another's actions are decided."""
    inference_max_batch: int = 8192
    """With node inference: most agent rows in one batch of the server."""
    inference_max_wait_ms: float = 0.0
    """With node inference: longest a request waits for others to join its batch (0: a batch goes as soon as the
    server is free, and the requests that arrive while it decides make the next one; a batch also goes at once when
    every connected lane waits). On 2 CPU cores 2 ms cost one worker a third of its steps (BENCHMARKS.md)."""
    inference_device: str = "auto"
    """The node server's device: 'auto' (cuda where visible), 'cpu', 'cuda'."""
    inference_idle_s: float = 30.0
    """With node inference: the server stops once no worker has been connected this long (0: never, for a server
    run as a service, e.g. a DaemonSet)."""
    inference_spawn: bool = True
    """With node inference: a worker that finds no server on its node starts one (false: another process runs it,
    as rapid train's launcher does)."""


@dataclass
class OptimizerConfig:
    batch_samples: int = 256
    """Samples (of bptt decisions each) per rank per update."""
    microbatch_samples: int = 0
    """Gradient accumulation chunk (0: the whole batch at once)."""
    buffer_samples: int = 4096
    """Experience buffer capacity per rank at the start; the oldest samples leave first. With pace_rollouts it grows
    to hold what arrives while a change of the rollouts' pace takes to show (no more than the optimizer trains while
    samples stay fresh), up to max_buffer_mb."""
    max_buffer_mb: float = 2048.0
    """With pace_rollouts: the most memory (MiB) a rank's buffer may grow to (≤ the size of buffer_samples: it
    keeps that size)."""
    max_staleness: int = 8
    """Samples more than this many versions behind are dropped."""
    max_reuse: float = 2.0
    """Without balancing: wait for new experience rather than draw a sample more than ceil(max_reuse)
    times or consume more than max_reuse × the samples received (less those wasted before any use). With
    balancing and several ranks: the most a rank short of fresh samples may reuse while its peers hold a batch
    on average, instead of holding them all back (the mean stays at target_reuse)."""
    target_reuse: float = 1.0
    """With balancing: the reuse held (samples consumed per sample received; OpenAI Five: about 1)."""
    balance: bool = True
    """Adapt the batch size (batch_samples … max_batch_samples) so reuse stays at target_reuse, publish
    about once per publish_interval_s, and log when rollouts outrun the optimizer (false: fixed
    batch_samples, publish_every and max_reuse)."""
    pace_rollouts: bool = True
    """With balancing: when unused samples pile up past what the optimizer can use (more than 4 batches, or half the
    buffer, waiting while samples go to waste), rank 0 asks the rollout workers to play less of their time (each
    version's meta carries the share, 5%–100%; back up as the backlog drains), so what is produced is trained
    instead of dropped stale or evicted unused."""
    max_batch_samples: int = 0
    """Largest batch the balancer may grow to (0: on a CPU learner 4 × batch_samples, at most buffer_samples / 2;
    on a GPU learner buffer_samples / 2); it keeps a growth only if samples per busy second rose with it."""
    publish_interval_s: float = 0.0
    """With balancing: seconds between published versions (0: rollout.upload_interval_s, so a staleness of
    one version means one upload behind)."""
    publish_every: int = 1
    """Without balancing: publish a parameter version every this many updates."""
    fold_interval_s: float = 0.0
    """Seconds between two poolings of the ranks' game tallies for the league, whether or not the ranks train
    meanwhile (0: half the publish interval with balancing, so a game is folded within one publish interval of
    its upload; at each publish without)."""
    checkpoint_every: int = 50
    """Checkpoint every this many updates (and at the end)."""
    keep_checkpoints: int = 3
    """Checkpoints kept in the store; older ones are deleted."""
    keep_versions: int = 32
    """Published parameter versions kept in the store; older ones are deleted after each publish (0: keep all).
    Resume needs only checkpoints; league snapshots are copies."""
    poll_s: float = 0.5
    """Seconds between listings of new experience objects while they keep coming; with fewer objects the
    wait grows towards one object per listing, up to poll_max_s (listings are what S3 charges most)."""
    poll_max_s: float = 5.0
    """Longest wait between listings of a rank's experience shards."""
    list_lookback_s: float = 120.0
    """A listing reads the keys named in the last list_lookback_s seconds: it covers clocks that run
    behind and slow uploads; anything later still is found by a full listing every sweep_s."""
    sweep_s: float = 300.0
    """Seconds between full listings of a rank's shards (objects the cursor missed: clocks far off, uploads
    slower than list_lookback_s)."""
    download_threads: int = 4
    """Experience downloads in flight per rank (one stream alone saturates long before the network)."""
    mark_s: float = 30.0
    """Seconds between a rank's notes of how far it has loaded its shards (loader/…): a restarted rank does
    not load again what it loaded before (0: no notes; a restart then loads everything still stored)."""
    device: str = "auto"
    """'auto' (CUDA local rank when present), 'cpu' or 'cuda'."""
    precision: str = "fp32"
    """The learner's forward and backward: 'fp32'; 'bf16' (bfloat16 autocast: about twice as fast where the
    device has bfloat16 units, and the log-probs then agree with the workers' to about 1e-2 instead of 1e-5);
    'auto' (bf16 where the device has them: a CUDA GPU from Ampere on, a CPU with AVX-512 BF16 or AMX, else
    fp32; emulated bfloat16 would be slower)."""
    torch_threads: int = 1
    """Torch CPU threads of an optimizer rank."""
    decode_workers: int = -1
    """Processes that decode and validate experience objects (-1: one per eight cores the rank may use, 1 to 8, and
    one more at a time while they are busy over 80% of 10 s, up to one per four cores; 0: in the loader thread,
    deterministic, for tests)."""
    collective_timeout_s: float = DEFAULT_TIMEOUT_S
    """Seconds a collective of the optimizer ranks (an all-reduce, a broadcast, their agreement) waits for the
    slowest rank before the job fails (NCCL's watchdog ends it); a rank waits for a batch at most a quarter of
    it (5 s at most) before it checks in with the others."""
    group_for_one: bool = False
    """Form a torch.distributed process group even for a single rank (rapid-optimizer, and rapid train's
    optimizer process), so its collectives run for real (NCCL on one GPU) as in a job of many ranks: for the
    cuda tests and to check a GPU host before a cluster run."""


@dataclass
class LeagueConfig:
    snapshot_every: int = 10
    """Add a snapshot of the policy to the pool every this many versions (0: never)."""
    latest_prob: float = 0.8
    """Share of the games not played against bots that are against the latest policy; the rest are
    against past snapshots (OpenAI Five: 0.8)."""
    eta: float = 0.01
    """Quality-score learning rate (OpenAI Five)."""
    scheme: str = "openai_five"
    """'openai_five' (p ∝ exp(q)) or 'pfsp' (prioritized fictitious self-play)."""
    pfsp_power: float = 2.0
    """PFSP weighting exponent p: a past policy is picked ∝ (1 - win rate against it)^p."""
    bot_prob: float = 0.0
    """Share of all games against scripted bots (those in ``bots``), taken first (at the start of the run)."""
    bot_prob_final: float = -1.0
    """Share of games against bots at the end of the run's budget (negative: bot_prob throughout). It stays at
    bot_prob through the first ``bot_begin`` of the budget, then moves linearly; the optimizer stamps each
    published version with its value, and rollout workers draw new games' opponents with the value of the version
    they play."""
    bot_begin: float = 0.0
    """The share of the run's budget (0 to 1) through which the bot share stays at bot_prob."""
    bots: list[str] = field(default_factory=list)
    """Scripted bots of the env that join the pool as training opponents (e.g. ['random', 'lane']): an opt-in
    curriculum; every shipped config is self-play only. A bot trained against may not be a rung of eval.ladder, and
    a win rate against it says nothing of strength."""
    warmup_bots: list[str] = field(default_factory=list)
    """Scripted bots that every game is played against through the warm-up (ppo.warmup_updates), and only then
    (e.g. ['random'], as RLlib's connect four self-play starts); they join the pool, where they are rated. An opt-in
    curriculum, like bots: a warm-up bot may not be a rung of eval.ladder."""
    refresh_s: float = 30.0
    """Seconds between pool re-reads in rollout workers, and between their draws of a new slate."""
    slate_size: int = 2
    """Past snapshots a rollout worker's games are drawn from at a time (redrawn every refresh_s): each game's
    opponent still follows the pool's distribution, but every distinct past policy in play is one more forward
    pass a step (benchmarks/bench_opponents.py)."""
    max_snapshots: int = 64
    """Active snapshots in the pool; past it the lowest-quality unpinned one is retired (0: no limit)."""
    keep_retired: int = 64
    """Retired snapshots kept (listed, re-activatable); older ones leave the pool document and their weights
    are deleted, so a long run's pool stops growing (-1: keep all)."""


@dataclass
class EvalConfig:
    interval_s: float = 20.0
    """Seconds between evaluations during `rapid train` (0: no evaluator)."""
    games: int = 200
    """Games per evaluation."""
    opponent: str = "random"
    """Baseline for the progress display and target_win_rate: a bot name."""
    pool_games: int = -1
    """Games per evaluation against a past snapshot of the pool, taken in turn, which rates versions against
    each other (-1: half of ``games``; 0: none). Both sides run a policy, so a game costs about twice a bot
    game."""
    core_share: float = 0.0
    """At most this share of one core for the evaluator over a run (0: no limit): after a round that took e
    seconds it waits at least e * (1 / core_share - 1), so on a laptop its games do not take the cores from
    the rollout workers and the learner (a round of 200 three-a-side games takes a core about 35 s)."""
    play: str = "sampled"
    """How the policy picks its actions against the baseline: 'sampled' (from its distribution, as in
    training), 'greedy' (the most likely action) or 'both' (the same games twice a round, sampled then
    greedy). The first mode played is rated and stops a run at run.target_win_rate."""
    early_interval_s: float = 0.0
    """Seconds between evaluations during the evaluator's first early_s seconds, instead of interval_s, so
    the first versions of a run are seen soon (0: interval_s throughout)."""
    early_s: float = 60.0
    """How long the early cadence (early_interval_s) lasts, from the evaluator's start."""
    ladder: dict[str, float] = field(default_factory=dict)
    """The strength ladder: opponents that training never meets, each with its fixed rating on one Elo scale
    (random at 0), e.g. {random = 0, lookahead = 560, "ref:configs/ladder/c4.rpm" = 900}. A rung is a bot of the
    env or ref:PATH, a frozen reference policy (`rapid export --format reference`). The evaluator rates the newest
    version against them every ladder_interval_s (`rapid eval --ladder` any version); `rapid eval --ladder
    --calibrate` measures the rungs' ratings. A rung may not be in league.bots or league.warmup_bots. Empty: none."""
    ladder_games: int = 200
    """Games against each rung of the ladder per rating."""
    ladder_interval_s: float = 60.0
    """Seconds between ladder ratings in the evaluator, the first this long after it starts (the first seconds'
    cores are the learner's)."""

    @property
    def pool_match_games(self) -> int:
        """Games against a past snapshot per round, with -1 resolved (half of ``games``, at least one)."""
        return max(self.games // 2, 1) if self.pool_games < 0 else self.pool_games

    @property
    def modes(self) -> tuple[str, ...]:
        """The baseline matches of a round, in the order played: the first is the rated one."""
        return ("sampled", "greedy") if self.play == "both" else (self.play,)


@dataclass
class StoreConfig:
    url: str = ""
    """Store URL: a path, file://… or s3://bucket/prefix (empty: <run dir>/store)."""
    endpoint_url: str = ""
    """S3 endpoint override (empty: AWS_ENDPOINT_URL or AWS's default)."""
    region: str = ""
    """S3 region (empty: the AWS default)."""
    max_attempts: int = 10
    """Attempts per S3 request (botocore standard retry mode)."""
    retention_s: float = 600.0
    """Experience objects older than this are deleted by the optimizer (0: keep)."""
    experience_shards: int = 0
    """Experience key shards, fixed when the run starts (layout.json); rank r lists shards r, r + R, …
    (0: the optimizer's rank count, so every rank lists one shard a poll)."""


@dataclass
class MetricsConfig:
    enabled: bool = True
    """Serve Prometheus /metrics from every process."""
    base_port: int = 0
    """First Prometheus port; a process serves on base_port + local rank (0: any free port)."""
    addr: str = "127.0.0.1"
    """Address the /metrics servers listen on (0.0.0.0: reachable from other machines)."""
    tensorboard: bool = True
    """Write TensorBoard event files under RUN_DIR/logs/tb/ (`tensorboard --logdir RUN_DIR/logs/tb`): the
    evaluator's win rates and ratings by version, and rank 0 of the optimizer's losses, KL, entropy, throughput,
    staleness and reuse by update."""
    wandb: str = ""
    """Log the same curves to Weights & Biases: 'offline' (files under RUN_DIR/logs/wandb/; `wandb sync` them
    later) or 'online' (after `wandb login`); needs `pip install 'rapid[wandb]'`. Project: $WANDB_PROJECT,
    else 'rapid'; one W&B run per role, grouped by the run. Empty: off."""


@dataclass
class Derived:
    """Sizes computed from the rest, in one place."""

    gamma: float
    segment_steps: int
    run_dir: str
    store_url: str
    population_url: str = ""
    """A population member's (pbt.member ≥ 0): the population's store, where its rounds are decided."""


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    league: LeagueConfig = field(default_factory=LeagueConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    pbt: PbtConfig = field(default_factory=PbtConfig)

    def derive(self, seconds_per_step: float = 1.0) -> Derived:
        run_dir = self.run.dir or default_run_dir(self.run.name, self.store.url)
        store_url, member = self.store.url or os.path.join(run_dir, "store"), self.pbt.member
        return Derived(
            gamma=1.0 - seconds_per_step / self.ppo.horizon_s,
            segment_steps=self.rollout.bptt * self.rollout.samples_per_segment,
            run_dir=member_folder(run_dir, member) if member >= 0 else run_dir,
            store_url=member_folder(store_url, member) if member >= 0 else store_url,
            population_url=store_url if member >= 0 else "",
        )


def default_run_dir(name: str, store_url: str) -> str:
    """The run directory when run.dir is empty: a store of its own gets a folder of its own (its logs, config and
    metrics registrations never mix with another run's of the same name).

    >>> default_run_dir("c4", ""), default_run_dir("c4", "s3://rapid-runs/exp1")
    ('runs/c4', 'runs/c4-32a3138b')
    """
    if not store_url:
        return os.path.join("runs", name)
    return os.path.join("runs", f"{name}-{hashlib.sha256(store_url.encode()).hexdigest()[:8]}")
