"""Each agent row's decisions, kept until they make whole samples: the rollout worker's trajectory builder.

A row (one agent of one game slot) records a decision when the learner's policy steps it: on its own turns in a
turn-based game, on every step otherwise (``EnvSpec.moving``). Rewards that arrive before the row's next
decision (the opponent's reply in a turn-based game) belong to its last decision, whose discount covers every
game step until the next one: one round of a turn-based game is one discount step, whoever moves in between.

A row's segment of ``size`` decisions is complete once what follows it is known: its next decision (the value
to bootstrap from; that decision starts the row's next segment) or the end of the game of its last decision.
A row lent to an opponent for a game records nothing meanwhile; its segment waits.

Usage (what ``RolloutWorker.collect`` does every step)::

    >>> import numpy as np
    >>> d = Decisions(rows=2, size=4, bptt=2, obs_dim=3, mask_dim=2, heads=1, lstm=5)
    >>> zeros = dict(obs=np.zeros((1, 3)), mask=np.ones((1, 2), bool), actions=np.zeros((1, 1)),
    ...              logp=np.zeros(1), values=np.zeros(1), active=np.ones(1, bool), h=np.zeros((1, 5)),
    ...              c=np.zeros((1, 5)))
    >>> for t in range(4):                       # row 0 moves on even steps; the game ends after step 3
    ...     if t % 2 == 0:
    ...         d.record(np.array([0]), version=7, opponents=["latest"], **zeros)
    ...     d.after_step(rewards=np.array([0.0, 0.0]) if t < 3 else np.array([-1.0, 1.0]),
    ...                  ended=np.array([t == 3, t == 3]))
    >>> d.complete().tolist()                     # 2 decisions, not yet 4
    []
    >>> d.gaps[0, :2].tolist(), d.rewards[0, :2].tolist(), d.done[0, :2].tolist()
    ([2, 2], [0.0, -1.0], [False, True])
"""

from __future__ import annotations

import numpy as np

from rapid.opt import losses

PER_DECISION = ("obs", "mask", "actions", "logp", "values", "rewards", "gaps", "done", "cut_value", "first", "active",
                "version", "opponent")


class Decisions:
    def __init__(self, rows: int, size: int, bptt: int, obs_dim: int, mask_dim: int, heads: int, lstm: int):
        if size % bptt:
            raise ValueError(f"a segment of {size} decisions does not split into samples of {bptt}")
        self.size, self.bptt = size, bptt
        cap = size + 1  # a whole segment and the decision after it
        self.n = np.zeros(rows, np.int64)
        """Decisions held per row."""
        self.obs = np.zeros((rows, cap, obs_dim), np.float32)
        self.mask = np.zeros((rows, cap, mask_dim), bool)
        self.actions = np.zeros((rows, cap, heads), np.int64)
        self.logp = np.zeros((rows, cap), np.float32)
        self.values = np.zeros((rows, cap), np.float32)
        self.rewards = np.zeros((rows, cap), np.float32)
        self.gaps = np.zeros((rows, cap), np.int64)
        """Game steps from each decision to the row's next one (or to the end of its game)."""
        self.done = np.zeros((rows, cap), bool)
        self.cut_value = np.zeros((rows, cap), np.float32)
        """The value of the row's view where its game was cut at a time limit after this decision (else 0)."""
        self.first = np.zeros((rows, cap), bool)
        self.active = np.zeros((rows, cap), bool)
        self.version = np.zeros((rows, cap), np.int64)
        self.opponent = np.zeros((rows, cap), object)
        # The LSTM state before every bptt-th decision: where samples start.
        self.h0 = np.zeros((rows, size // bptt + 1, lstm), np.float32)
        self.c0 = np.zeros((rows, size // bptt + 1, lstm), np.float32)
        self.in_game = np.zeros(rows, bool)
        """The row's last decision belongs to the game now running (so the game's rewards are its)."""
        self.fresh = np.ones(rows, bool)
        """The row's next decision is the first of its game."""

    def record(self, rows: np.ndarray, obs, mask, actions, logp, values, active, h, c, version: int,
               opponents: list[str]) -> None:
        """Decisions of ``rows`` (int [N]) made now: their inputs, choices and pre-decision LSTM state (h, c)."""
        k = self.n[rows]
        if (k > self.size).any():
            raise RuntimeError("a complete segment was not taken before the row's next decision")
        for name, value in (("obs", obs), ("mask", mask), ("actions", actions), ("logp", logp),
                            ("values", values), ("active", active)):
            getattr(self, name)[rows, k] = value
        self.rewards[rows, k] = 0.0
        self.gaps[rows, k] = 0
        self.done[rows, k] = False
        self.cut_value[rows, k] = 0.0
        self.first[rows, k] = self.fresh[rows]
        self.version[rows, k] = version
        self.opponent[rows, k] = np.asarray(opponents, dtype=object)
        starts = k % self.bptt == 0
        self.h0[rows[starts], k[starts] // self.bptt] = h[starts]
        self.c0[rows[starts], k[starts] // self.bptt] = c[starts]
        self.fresh[rows] = False
        self.in_game[rows] = True
        self.n[rows] = k + 1

    def after_step(self, rewards: np.ndarray, ended: np.ndarray, cut_values: np.ndarray | None = None) -> None:
        """One game step went by: ``rewards`` [rows] are earned by each row's last decision; ``ended`` [rows]
        rows whose game ended (a row in the next game starts afresh); ``cut_values`` [rows] the value of each
        row's view where its game was cut at a time limit (0 elsewhere), which its last decision bootstraps
        from."""
        live = np.flatnonzero(self.in_game)
        last = self.n[live] - 1
        self.rewards[live, last] += rewards[live]
        self.gaps[live, last] += 1
        over = np.flatnonzero(ended & self.in_game)
        self.done[over, self.n[over] - 1] = True
        if cut_values is not None:
            self.cut_value[over, self.n[over] - 1] = cut_values[over]
        self.in_game[ended] = False
        self.fresh[ended] = True

    def complete(self) -> np.ndarray:
        """Rows (int) whose segment is complete; ``take`` them before their next decision."""
        ends = self.done[:, self.size - 1] & (self.n == self.size)
        return np.flatnonzero((self.n == self.size + 1) | ends)

    def take(self, rows: np.ndarray, gamma: float, lam: float) -> dict[str, np.ndarray]:
        """The complete segments of ``rows`` as samples [rows·size/bptt, bptt, ...] with advantages and
        returns (``gamma`` per game step); ``opponent`` holds each sample's opponent id (the experience format
        wants an index: ``RolloutWorker.collect`` makes it). The rows keep only the decision after their
        segment.

        For a learner that recomputes the targets (V-trace) each sample also carries what GAE was fed: each
        step's ``rewards`` (mixed, a cut game's value included), ``discounts`` (γ over the game steps to the next
        decision, 0 where the game ended) and its ``bootstrap``: the value of the decision after its last step
        (the next sample's first, the segment's for its last sample; 0 where the game ended)."""
        T, L = self.size, self.bptt
        bootstrap = np.where(self.n[rows] > T, self.values[rows, T], 0.0)
        seg = {name: getattr(self, name)[rows, :T] for name in PER_DECISION}
        discount = gamma ** seg["gaps"].astype(np.float64)
        # A game cut at a time limit ends the trajectory but not the agent's prospects: the decision before the
        # cut earns the discounted value of the view there (a TD target through the reset).
        rewards = seg["rewards"] + discount * seg["cut_value"]
        adv, ret = losses.gae(rewards.T, seg["values"].T, seg["done"].T, bootstrap, discount.T, lam)
        per_sample = len(rows) * (T // L)

        def samples(x: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(x.reshape(per_sample, L, *x.shape[2:]))

        arrays = {name: samples(seg[name]) for name in ("obs", "mask", "actions", "logp", "values", "first",
                                                         "active")}
        arrays["advantages"], arrays["returns"] = samples(adv.T), samples(ret.T)
        arrays["rewards"] = samples(rewards.astype(np.float32))
        arrays["discounts"] = samples((discount * ~seg["done"]).astype(np.float32))
        following = np.concatenate([seg["values"][:, L::L], bootstrap[:, None]], 1)  # [rows, samples per segment]
        ended = samples(seg["done"])[:, -1]
        arrays["bootstrap"] = np.where(ended, 0.0, following.reshape(per_sample)).astype(np.float32)
        arrays["own"] = np.ones_like(arrays["active"])
        lstm = self.h0.shape[-1]
        arrays["h0"] = np.ascontiguousarray(self.h0[rows, :T // L].reshape(per_sample, lstm))
        arrays["c0"] = np.ascontiguousarray(self.c0[rows, :T // L].reshape(per_sample, lstm))
        arrays["version"] = samples(seg["version"]).min(1)
        arrays["opponent"] = samples(seg["opponent"])[:, 0].astype(str)
        self._keep_the_next_decision(rows)
        return arrays

    def _keep_the_next_decision(self, rows: np.ndarray) -> None:
        carry = rows[self.n[rows] > self.size]
        for name in PER_DECISION:
            array = getattr(self, name)
            array[carry, 0] = array[carry, self.size]
        self.h0[carry, 0] = self.h0[carry, -1]
        self.c0[carry, 0] = self.c0[carry, -1]
        self.n[rows] = 0
        self.n[carry] = 1
