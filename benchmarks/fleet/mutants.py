"""Bugs a person could write in rapid's loops, threads and store paths, each planted in a scratch copy of rapid.

Each :class:`Mutant` is one or more textual edits of product code (a file under rapid's installed layout, as
``pyproject.toml``'s ``package-dir`` maps it: ``rapid/roles/…``, ``rapid/opt/…`` for ``opt/``). An edit names
the exact text it replaces, which must occur exactly once: a refactor that moves the text makes the mutant
fail loudly instead of running unmutated and counting as missed. The list is of bugs in the code paths the
model runs, not bugs chosen to hit a figure; ``benchmarks/bench_mutants.py`` plants each one and runs the small
fleets on it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str  # the bug, in a line
    path: str  # the file in the installed layout (rapid/…)
    edits: tuple[tuple[str, str], ...]  # (text, replacement): each text occurs exactly once


def mutant(name: str, what: str, path: str, *edits: tuple[str, str]) -> Mutant:
    return Mutant(name, what, path, edits)


LOOP = "rapid/roles/optimizer_loop.py"
MUTANTS = [
    # the optimizer's update loop
    mutant("publish-stops-after-v5", "the loop counts versions on, but stops queueing them after v5", LOOP,
           ("        if writer is not None:\n            league = p.league",
            "        if writer is not None and version <= 5:\n            league = p.league")),
    mutant("publish-ships-first-weights", "the weights are copied once and that copy published every time", LOOP,
           ("            tensors = p.tensors()",
            "            tensors = self.__dict__.setdefault(\"first_tensors\", p.tensors())")),
    mutant("rank-leaves-on-own-flag", "a rank leaves on its own stop flag, before the ranks agree", LOOP,
           ("            self._check_limits()\n",
            "            self._check_limits()\n            if self.stop:\n                return self.exit_code\n")),
    mutant("rank0-never-checkpoints", "the checkpoint condition inverted: only ranks that store nothing", LOOP,
           ("        return self.lead and self.p.learner.updates - self.last_ckpt_updates",
            "        return not self.lead and self.p.learner.updates - self.last_ckpt_updates")),
    mutant("fold-own-tally-only", "rank 0 folds its own games, not the ranks' pooled ones", LOOP,
           ("        self.p.league.fold(Tally.merge(tallies))", "        self.p.league.fold(Tally.decode(mine))")),
    mutant("pool-clock-never-reset", "the fold interval's clock is never reset: the ranks pool every round", LOOP,
           ("                self.last_pool = interval_mark(self.last_pool, self.clock.monotonic(), "
            "self.pool_interval_s)\n", "")),
    mutant("publish-due-args-swapped", "publish_due's time arguments swapped: never due", LOOP,
           ("publish_due(self.clock.monotonic(), self.last_publish,",
            "publish_due(self.last_publish, self.clock.monotonic(),")),
    mutant("final-publish-skipped", "no version at a clean stop for the updates since the last one", LOOP,
           ("        if self.p.learner.updates > self.published_updates and not",
            "        if self.p.learner.updates < self.published_updates and not")),
    # rank 0's league keeper
    mutant("snapshots-never-join", "the keeper adds the snapshots of the list it just emptied",
           "rapid/roles/league_keeper.py",
           ("        for snapshot in snapshots:", "        for snapshot in self._snapshots:")),
    mutant("keeper-commits-empty-tally", "the keeper commits the emptied pending tally, and counts the games",
           "rapid/roles/league_keeper.py", ("fold_tally(s, tally, self.cfg.league.eta)",
                                            "fold_tally(s, self._tally, self.cfg.league.eta)")),
    mutant("snapshot-every-version", "the snapshot condition's and written or", "rapid/roles/league_keeper.py",
           ("        if every and version % every == 0:", "        if every or version % every == 0:")),
    # the parameter store and the node cache
    mutant("latest-before-object", "LATEST moved before the version's object is stored", "rapid/run/param_store.py",
           ("        if not self.store.put_if_absent(params_key(version), data):",
            "        write_version_pointer(self.store, PARAMS_LATEST, version)\n"
            "        if not self.store.put_if_absent(params_key(version), data):")),
    mutant("node-cache-rereads-latest", "the node's copy of a pointer is never fresh: every call re-reads it",
           "rapid/rollout/node_cache.py",
           ("            if ttl is not None and self.clock() - path.stat().st_mtime >= ttl:",
            "            if ttl is not None:")),
    mutant("node-cache-serves-nothing", "the node cache passes every read to the store", "rapid/rollout/node_cache.py",
           ("        if ttl is None and not IMMUTABLE.fullmatch(key):", "        if True:")),
    # the rollout worker's loop and threads
    mutant("worker-never-swaps", "the worker takes a newer version from the poller but never plays it",
           "rapid/roles/rollout_loop.py", ("m.param_version(self._swap(newer))", "m.param_version(self.version)")),
    mutant("uploader-drops-a-sample", "an object's slice starts one row late: a sample lost before it is counted",
           "rapid/rollout/uploader.py", ("part = {k: v[start:start + step]", "part = {k: v[start + 1:start + step]")),
    mutant("backlog-drops-newest", "a full backlog drops its newest object", "rapid/rollout/uploader.py",
           ("            dropped = self._backlog.popleft()", "            dropped = self._backlog.pop()")),
    mutant("failed-upload-lost", "an upload that failed is not put back in the backlog", "rapid/rollout/uploader.py",
           ("                self._backlog.appendleft(item)  # first in line again; the bound may now drop it\n", "")),
    mutant("games-in-later-parts", "an object's games travel with the parts after the first",
           "rapid/rollout/uploader.py",
           ("episodes=episodes if first else []", "episodes=episodes if not first else []")),
    mutant("segment-added-twice", "the loop hands each segment to the uploader twice", "rapid/roles/rollout_loop.py",
           ("            self.uploader.add(segment)\n",
            "            self.uploader.add(segment)\n            self.uploader.add(segment)\n")),
    mutant("poller-refetches-known", "the poller takes the version it has as newer", "rapid/roles/rollout.py",
           ("(self._known is not None and latest <= self._known)",
            "(self._known is not None and latest < self._known)")),
    mutant("run-watch-asks-when-fresh", "the run watch's quiet test inverted: it reads the lease while versions come",
           "rapid/run/run_watch.py",
           ("(now - last_version_at < self.quiet_s or", "(now - last_version_at > self.quiet_s or")),
    mutant("run-watch-expiry-inverted", "the run watch calls a lease dead while it is still valid",
           "rapid/run/run_watch.py", ("if holder.expires < self.clock():", "if holder.expires > self.clock():")),
    mutant("server-versions-inverted", "a worker under node inference takes the server's version only when it "
           "already has it", "rapid/rollout/inference_client.py",
           ("if version is None or version == self._known:", "if version is None or version != self._known:")),
    mutant("key-time-in-seconds", "an experience key is named with the upload's time in seconds, not ms",
           "rapid/rollout/uploader.py", ("experience_key(shard, int(self.clock() * 1000),",
                                         "experience_key(shard, int(self.clock()),")),
    # the learner's draw-ahead (OptimizerLoop._draw_ahead, run by the stand-in learner's prefetch)
    mutant("ahead-after-fresh", "the loop waits for a fresh batch before taking the one drawn ahead", LOOP,
           ("batch = pending or self._take_ahead() or (yield from self._wait_for_batch())",
            "batch = pending or (yield from self._wait_for_batch()) or self._take_ahead()")),
    mutant("ahead-staleness-not-aged", "a batch drawn ahead keeps the staleness it had when drawn", LOOP,
           ("(ahead[0], ahead[1] + (self.version - self.ahead_version))", "(ahead[0], ahead[1])")),
    mutant("ahead-guard-inverted", "the last-update guard inverted: a batch is drawn ahead only once stopping",
           LOOP, ("        return bool(self.stop) or bool(self.cfg.run.updates",
                  "        return not self.stop or bool(self.cfg.run.updates")),
    # the rollout worker's own bookkeeping (RolloutWorker and Decisions, run by the small fleet's real workers)
    mutant("sample-version-newest", "a sample is stamped with the newest version among its decisions",
           "rapid/rollout/decisions.py", ('arrays["version"] = samples(seg["version"]).min(1)',
                                          'arrays["version"] = samples(seg["version"]).max(1)')),
    mutant("carry-not-kept", "a row's decision after its segment is copied forward but its count reset to 0",
           "rapid/rollout/decisions.py", ("        self.n[carry] = 1\n", "")),
    mutant("controllers-kept-after-game", "a finished game's new opponent and sides do not reset who controls "
           "which agent", "rapid/rollout/worker.py",
           ("        self._control = None\n        self.inference.reset", "        self.inference.reset")),
    # the optimizer's loader and buffer
    mutant("loader-forgets-seen", "the loader does not remember the keys it took", "rapid/optimizer/loader.py",
           ("            self._seen.add(key)\n            if self.decoder", "            if self.decoder")),
    mutant("loader-cursor-ahead", "the listing cursor's lookback added instead of subtracted",
           "rapid/optimizer/loader.py", ("        since_ms = int((now - self.lookback_s) * 1000)",
                                         "        since_ms = int((now + self.lookback_s) * 1000)")),
    mutant("tally-never-taken", "the loader's tally is handed over but never reset", "rapid/optimizer/loader.py",
           ("            out, self._tally = self._tally, Tally()", "            out = self._tally")),
    mutant("buffer-counts-after-use", "the buffer counts first uses after marking the samples used",
           "rapid/opt/buffer.py",
           ("            self._stats.used += int((self._uses[chosen] == 0).sum())\n"
            "            self._uses[chosen] += 1",
            "            self._uses[chosen] += 1\n"
            "            self._stats.used += int((self._uses[chosen] == 0).sum())")),
    mutant("buffer-stale-off-by-one", "staleness compared with >= instead of >", "rapid/opt/buffer.py",
           ("current_version - self._arrays[\"version\"] > self.max_staleness",
            "current_version - self._arrays[\"version\"] >= self.max_staleness")),
    mutant("checkpoint-retention-inverted", "checkpoint retention deletes the newest instead of the oldest",
           "rapid/optimizer/checkpoints.py",
           ("checkpoint_versions(store)[:-keep]", "checkpoint_versions(store)[-keep:]")),
    # the league's results and the workers' draws of opponents (2026-11-28, with the figures of who played whom)
    mutant("fold-wins-as-losses", "a member's wins and losses added the wrong way round", "rapid/league/results.py",
           ("m.wins, m.losses, m.draws = m.wins + wins, m.losses + losses, m.draws + draws",
            "m.wins, m.losses, m.draws = m.wins + losses, m.losses + wins, m.draws + draws")),
    mutant("latest-games-not-counted", "games against the latest policy skipped at the fold, not counted",
           "rapid/league/results.py", ("            state.latest_games += wins + losses + draws\n", "")),
    mutant("past-share-inverted", "the share of past opponents taken as latest_prob, not 1 - latest_prob",
           "rapid/league/sampling.py", ("* (1.0 - config.latest_prob) if past else 0.0",
                                        "* config.latest_prob if past else 0.0")),
    mutant("sampler-refresh-inverted", "a worker re-reads the pool only while its copy is fresh",
           "rapid/league/sampling.py", ("now - self._refreshed_at < self.refresh_s:",
                                        "now - self._refreshed_at > self.refresh_s:")),
    mutant("shards-strided-wrong", "a rank lists every world-th shard from 0, not from its rank",
           "rapid/run/store_map.py", ("return list(range(rank, shards, world)) if world <= shards",
                                      "return list(range(0, shards, world)) if world <= shards")),
    # the run's lease (the lease-lost fleet)
    mutant("lease-loss-ignored", "a renewal that finds the lease taken keeps the optimizer running",
           "rapid/run/lease.py", ("                stop.set(LEASE_LOST)\n                return False\n",
                                  "                return True\n")),
    mutant("means-not-divided", "the agreement's means are sums: rank 0 balances on R times the backlog",
           "rapid/roles/lockstep.py", ("merged[f\"mean.{k}\"] / merged[\"ranks\"]", "merged[f\"mean.{k}\"]")),
]
