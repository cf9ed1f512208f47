"""The rollout worker's trajectory builder (rapid.rollout.decisions) against hand-computed returns."""

from __future__ import annotations

import numpy as np

from rapid.rollout.decisions import Decisions

GAMMA = 0.9


def inputs(n: int, value: float = 0.0, h: float = 0.0) -> dict:
    return dict(obs=np.zeros((n, 2)), mask=np.ones((n, 3), bool), actions=np.zeros((n, 1)), logp=np.zeros(n),
                values=np.full(n, value), active=np.ones(n, bool), h=np.full((n, 4), h), c=np.full((n, 4), h))


def test_a_decision_is_discounted_over_every_game_step_until_the_agents_next_one():
    """Three players take turns; player 0's moves are three game steps apart. With λ = 1 and zero values its
    return is the final reward discounted per game step, γ³ per move of its own (not γ per move)."""
    d = Decisions(rows=3, size=4, bptt=2, obs_dim=2, mask_dim=3, heads=1, lstm=4)
    steps = 12  # player 0 moves at steps 0, 3, 6, 9; the game ends after step 11
    for t in range(steps):
        mover = np.array([t % 3])
        d.record(mover, version=5, opponents=["latest"], **inputs(1))
        reward = np.array([1.0, 0.0, 0.0]) if t == steps - 1 else np.zeros(3)
        d.after_step(reward, ended=np.full(3, t == steps - 1))
    assert d.complete().tolist() == [0, 1, 2]
    arrays = d.take(np.array([0]), gamma=GAMMA, lam=1.0)
    np.testing.assert_allclose(arrays["returns"].ravel(), [GAMMA ** 9, GAMMA ** 6, GAMMA ** 3, 1.0], rtol=1e-6)
    np.testing.assert_allclose(arrays["discounts"].ravel(), [GAMMA ** 3] * 3 + [0.0], rtol=1e-6)  # γ per game step
    assert arrays["first"].ravel().tolist() == [True, False, False, False]
    assert arrays["opponent"].tolist() == ["latest", "latest"] and arrays["version"].tolist() == [5, 5]
    assert d.n[0] == 0 and d.complete().tolist() == [1, 2]


def test_a_segment_bootstraps_from_the_next_decision_which_starts_the_next_segment():
    d = Decisions(rows=1, size=4, bptt=2, obs_dim=2, mask_dim=3, heads=1, lstm=4)
    for k in range(5):
        d.record(np.array([0]), version=k, opponents=["latest"], **inputs(1, value=10.0 * k, h=k + 1))
        d.after_step(np.zeros(1), ended=np.zeros(1, bool))
        assert d.complete().tolist() == ([0] if k == 4 else [])
    arrays = d.take(np.array([0]), gamma=GAMMA, lam=1.0)
    assert arrays["returns"][1, 1] == np.float32(GAMMA * 40.0)   # the fifth decision's value
    assert arrays["version"].tolist() == [0, 2]                  # a sample is as old as its oldest decision
    assert arrays["h0"][:, 0].tolist() == [1.0, 3.0]             # the state before each sample's first decision
    # The fifth decision is kept as the first of the next segment, with its state.
    assert d.n[0] == 1 and d.values[0, 0] == 40.0 and d.h0[0, 0, 0] == 5.0 and d.version[0, 0] == 4


def test_a_row_lent_to_an_opponent_keeps_its_segment_until_it_plays_again():
    """Rewards of games the learner does not play in are not its own; the next game starts afresh."""
    d = Decisions(rows=1, size=2, bptt=2, obs_dim=2, mask_dim=3, heads=1, lstm=4)
    d.record(np.array([0]), version=1, opponents=["v3"], **inputs(1))
    d.after_step(np.array([-1.0]), ended=np.ones(1, bool))       # the game ends: lost
    d.after_step(np.array([5.0]), ended=np.zeros(1, bool))        # a game the learner does not play
    d.after_step(np.array([5.0]), ended=np.ones(1, bool))
    assert d.complete().tolist() == []
    d.record(np.array([0]), version=2, opponents=["latest"], **inputs(1))
    d.after_step(np.array([1.0]), ended=np.ones(1, bool))
    arrays = d.take(d.complete(), gamma=GAMMA, lam=1.0)
    assert arrays["returns"].tolist() == [[-1.0, 1.0]] and arrays["first"].tolist() == [[True, True]]
    assert arrays["opponent"].tolist() == ["v3"], "a sample's opponent is its first decision's"


def test_a_game_cut_at_a_time_limit_bootstraps_from_the_value_of_the_view_at_the_cut():
    """A cut is not an end the agent could see: its last decision earns r + γ^gap · V(view at the cut), where a
    game ended by its rules gives r alone. The next game starts afresh either way."""
    returns = {}
    for cut_value in (None, 4.0):
        d = Decisions(rows=2, size=2, bptt=2, obs_dim=2, mask_dim=3, heads=1, lstm=4)
        for t in range(2):  # row 0 moves on both steps of its game; row 1 waits (a turn-based game)
            d.record(np.array([0]), version=1, opponents=["latest"], **inputs(1, value=1.0))
            ended = np.full(2, t == 1)
            cuts = None if cut_value is None or t == 0 else np.array([cut_value, 0.0])
            d.after_step(np.array([0.5, 0.0]), ended=ended, cut_values=cuts)
        assert d.complete().tolist() == [0]
        returns[cut_value] = d.take(np.array([0]), gamma=GAMMA, lam=1.0)["returns"].ravel()
        assert d.fresh.all() and not d.in_game.any()
    np.testing.assert_allclose(returns[None], [0.5 + GAMMA * 0.5, 0.5], rtol=1e-6)
    last = 0.5 + GAMMA * 4.0
    np.testing.assert_allclose(returns[4.0], [0.5 + GAMMA * last, last], rtol=1e-6)


def test_each_sample_carries_the_rewards_discounts_and_bootstrap_its_targets_came_from():
    """What a learner needs to compute V-trace itself: with λ = 0 the worker's advantage of every step is its
    one-step TD error from these fields alone (r_t + γ_t·V(x_{t+1}) − V(x_t), the sample's bootstrap after its
    last step). A game cut at a time limit after step 1 (the first sample's last) adds the discounted value of
    the view there to that step's reward and bootstraps from nothing more; the next game starts at step 2."""
    d = Decisions(rows=1, size=4, bptt=2, obs_dim=2, mask_dim=3, heads=1, lstm=4)
    rewards = [0.5, -1.0, 0.25, 2.0, 0.0]
    for k in range(5):
        d.record(np.array([0]), version=1, opponents=["latest"], **inputs(1, value=10.0 * (k + 1)))
        d.after_step(np.array([rewards[k]]), ended=np.array([k == 1]),
                     cut_values=np.array([7.0]) if k == 1 else None)
    arrays = d.take(d.complete(), gamma=GAMMA, lam=0.0)
    np.testing.assert_allclose(arrays["rewards"], [[0.5, -1.0 + GAMMA * 7.0], [0.25, 2.0]], rtol=1e-6)
    np.testing.assert_array_equal(arrays["discounts"], np.float32([[GAMMA, 0.0], [GAMMA, GAMMA]]))
    assert arrays["bootstrap"].tolist() == [0.0, 50.0]  # the game ended; the fifth decision's value
    assert {arrays[k].dtype for k in ("rewards", "discounts", "bootstrap")} == {np.dtype(np.float32)}
    following = np.concatenate([arrays["values"][:, 1:], arrays["bootstrap"][:, None]], 1)
    td = arrays["rewards"] + arrays["discounts"] * following - arrays["values"]
    np.testing.assert_allclose(arrays["advantages"], td, rtol=1e-6)


def test_an_inner_sample_bootstraps_from_the_next_samples_first_value():
    d = Decisions(rows=1, size=4, bptt=2, obs_dim=2, mask_dim=3, heads=1, lstm=4)
    for k in range(5):
        d.record(np.array([0]), version=1, opponents=["latest"], **inputs(1, value=k + 1.0))
        d.after_step(np.zeros(1), ended=np.zeros(1, bool))
    arrays = d.take(d.complete(), gamma=GAMMA, lam=0.95)
    assert arrays["bootstrap"].tolist() == [3.0, 5.0] and (arrays["discounts"] == np.float32(GAMMA)).all()
