"""The balancer's decisions as pure functions, and the Balancer over simulated arrivals."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

from rapid.optimizer.balance import Balancer, BalanceSettings, growth_paid, next_batch, overload_line, publish_due, rate


def test_batch_grows_with_backlog_and_shrinks_when_idle_within_bounds():
    assert next_batch(256, backlog=600, idle_share=0.0, lo=256, hi=1024) == 320
    assert next_batch(1000, backlog=5000, idle_share=0.0, lo=256, hi=1024) == 1024        # capped
    assert next_batch(256, backlog=300, idle_share=0.0, lo=256, hi=1024) == 256           # within two batches
    assert next_batch(512, backlog=100, idle_share=0.9, lo=256, hi=1024) == 409
    assert next_batch(300, backlog=0, idle_share=0.9, lo=256, hi=1024) == 256             # never below lo
    assert next_batch(512, backlog=100, idle_share=0.2, lo=256, hi=1024) == 512           # busy: keep
    assert next_batch(256, backlog=600, idle_share=0.0, lo=256, hi=2048, multiple=256) == 512
    assert next_batch(512, backlog=0, idle_share=1.0, lo=256, hi=2048, multiple=256) == 256


def test_publish_by_time_and_rates():
    assert publish_due(10.0, 8.0, 2.0) and not publish_due(9.9, 8.0, 2.0)
    assert rate(deque([(0.0, 0.0), (2.0, 100.0)])) == 50.0
    assert rate(deque([(1.0, 5.0)])) == 0.0


def test_overload_line_only_when_samples_go_unused_at_the_largest_batch():
    assert overload_line(1000, 400, 1.0, 0.5, at_max=False) is None
    assert overload_line(1000, 400, 1.0, 0.01, at_max=True) is None
    line = overload_line(1000, 400, 1.0, 0.5, at_max=True)
    assert "1,000 samples/s" in line and "400/s" in line and "2.5×" in line and "fewer rollout workers" in line
    assert "\n" not in line


def simulate(arrival_per_s: float, cost_per_sample_s: float, overhead_s: float, seconds: float, hi: int,
             cost_exponent: float = 0.0, slowdown=lambda now: 1.0, lo: int = 64):
    """Samples arrive at a fixed rate; an update of b samples takes overhead + b × cost × (b / lo)^exponent
    (a cost per sample that rises with the batch, as on a CPU), times ``slowdown(now)`` (other processes
    sharing the cores); reuse target 1."""
    bal = Balancer(BalanceSettings(batch=lo, max_batch=hi, target_reuse=1.0, publish_interval_s=2.0))
    now = received = consumed = wasted = 0.0
    backlog, capacity = 0.0, 4096
    messages = []
    while now < seconds:
        b = bal.batch
        if backlog < b:  # wait for data
            now += 0.1
            received += arrival_per_s * 0.1
            backlog += arrival_per_s * 0.1
            busy = 0.0
        else:
            busy = (overhead_s + b * cost_per_sample_s * (b / lo) ** cost_exponent) * slowdown(now)
            now += busy
            received += arrival_per_s * busy
            backlog += arrival_per_s * busy - b
            consumed += b
        if backlog > capacity:
            wasted += backlog - capacity
            backlog = capacity
        d = bal.step(now, int(received), int(consumed), int(wasted), int(backlog), busy)
        if d.message:
            messages.append(d.message)
    return bal, d, received, consumed, wasted, messages


def test_balancer_keeps_up_by_growing_the_batch():
    # 2,000 samples/s; an update costs 50 ms + 0.2 ms a sample: batch 64 absorbs ~1,000/s, 512 absorbs ~3,400/s
    bal, d, received, consumed, wasted, messages = simulate(2000, 2e-4, 0.05, 120, hi=1024)
    assert 128 < bal.batch <= 1024
    assert consumed / received > 0.95 and wasted / received < 0.05 and not messages
    assert abs(d.arrival_per_s - 2000) < 100 and d.capacity_per_s > 2000


def test_a_growth_stays_only_if_samples_per_busy_second_rise_with_it():
    assert growth_paid(256, 1000.0, 320, 1200.0)       # +20% for +25%: the overhead was amortized
    assert not growth_paid(256, 1000.0, 320, 1030.0)   # +3% for +25%: not worth the staler updates
    assert not growth_paid(128, 1000.0, 160, 950.0)    # a CPU: each sample costs more in a bigger batch
    assert growth_paid(243, 2464.0, 256, 2530.0)       # a small last step to the cap gains a little


def test_balancer_keeps_the_batch_where_a_bigger_one_costs_more_per_sample():
    # The CPU measured for configs/default.toml: 0.27 ms a sample at 128, 0.48 ms at 1,024 (exponent 0.28).
    bal, d, received, consumed, wasted, messages = simulate(20_000, 2.1e-4, 0.0, 120, hi=1024, cost_exponent=0.28)
    assert bal.batch <= 80 and bal.ceiling <= 80        # one trial at 80, then back to 64 for the run
    assert d.overloaded and "receives 20,000 samples/s" in messages[0]


def laptop_neighbours(now: float) -> float:
    """A laptop run's other processes as the optimizer saw them in connect four (BENCHMARKS.md, "The batch
    balancer under start-up noise"): updates 40% slower and uneven while the rollout worker and the
    evaluator start (the first 3 s), then 60% slower for the 1.5 s of each evaluation round every 5 s."""
    if now < 3.0:
        return 1.4 + 0.5 * ((now * 7.3) % 1.0)
    return 1.6 if now % 5.0 < 1.5 else 1.0


def test_balancer_is_not_fooled_by_neighbours_into_a_batch_that_costs_more():
    # configs/default.toml's learner on the VM: 76 ms an update at 256 and 122 ms at 400, so a bigger batch
    # moves no more samples a second. Start-up noise and evaluation rounds made the old trials (8 updates,
    # judged against everything since the last change) keep 320, then 400: 27% fewer updates in 5 minutes.
    bal, *_ = simulate(20_000, 0.297e-3, 0.0, 120, hi=1024, cost_exponent=0.06, slowdown=laptop_neighbours, lo=256)
    assert bal.batch == 256 and bal.ceiling <= 320


def test_balancer_says_when_rollouts_outrun_it():
    bal, d, received, consumed, wasted, messages = simulate(10_000, 2e-4, 0.05, 200, hi=256)
    assert bal.batch == 256 and d.overloaded
    assert 1 <= len(messages) <= 4                               # rate-limited: once a minute
    assert "receives 10,000 samples/s" in messages[0]


def test_balancer_shrinks_back_when_arrivals_slow():
    bal = Balancer(BalanceSettings(batch=64, max_batch=1024, target_reuse=1.0, publish_interval_s=1.0))
    bal.batch = 512
    for t in range(1, 30):
        bal.step(float(t), received=10 * t, consumed=10 * t, wasted=0, backlog=0, busy_s=0.01)
    assert bal.batch == 64


def paced_run(pacing: bool, seconds: float = 600.0, full_rate: float = 2000.0, delay_s: float = 4.0,
              buffer: int = 4096, most: int = 0):
    """Rollouts that could send 2,000 samples/s to an optimizer that trains 1,000/s at its largest batch; the pace
    rank 0 asks for reaches what arrives ``delay_s`` later (the next version, then an upload); the buffer starts at
    ``buffer`` samples and may grow to ``most``. Returns the pace over time and the share of samples wasted in the
    second half."""
    bal = Balancer(BalanceSettings(batch=256, max_batch=256, target_reuse=1.0, publish_interval_s=2.0,
                                   buffer=buffer if pacing else 0, pace_every_s=max(5.0, delay_s), max_buffer=most))
    now = received = consumed = wasted = backlog = 0.0
    asked: deque[tuple[float, float]] = deque([(0.0, 1.0)])
    paces, half = [], None
    while now < seconds:
        while len(asked) > 1 and asked[1][0] <= now - delay_s:
            asked.popleft()
        arrival = full_rate * asked[0][1]
        busy = 0.256 if backlog >= 256 else 0.0  # 1 ms a sample
        step = busy or 0.05
        now += step
        received += arrival * step
        backlog += arrival * step - (256 if busy else 0)
        consumed += 256 if busy else 0
        if backlog > buffer:
            wasted, backlog = wasted + backlog - buffer, buffer
        d = bal.step(now, int(received), int(consumed), int(wasted), int(backlog), busy)
        buffer = max(buffer, d.buffer)
        asked.append((now, d.pace))
        paces.append(d.pace)
        if half is None and now >= seconds / 2:
            half = (received, wasted)
    return paces, (wasted - half[1]) / (received - half[0])


def test_the_pace_slows_rollouts_to_what_the_optimizer_trains_and_nothing_goes_to_waste():
    paces, waste = paced_run(pacing=True)
    late = paces[len(paces) // 2:]
    assert waste < 0.05, f"{waste:.1%} of samples wasted with pacing"
    assert 0.3 < sum(late) / len(late) < 0.75, "about half speed: what the optimizer trains"
    _, unpaced = paced_run(pacing=False)
    assert unpaced > 0.4, f"without pacing half of what arrives is wasted ({unpaced:.0%})"


def test_the_pace_holds_when_a_change_takes_long_to_show():
    # uploads a minute apart (half of it, on average), and a buffer for what arrives meanwhile (30 s at full speed)
    _, waste = paced_run(pacing=True, delay_s=30.0, seconds=1800.0, buffer=65536)
    assert waste < 0.05


def test_the_pace_comes_back_when_the_optimizer_keeps_up():
    paces, waste = paced_run(pacing=True, full_rate=800.0)
    assert waste == 0.0 and min(paces) == 1.0, "an optimizer that keeps up never slows the rollouts"


def test_the_buffer_grows_to_hold_what_arrives_while_a_pace_takes_to_show():
    # uploads a minute apart: a 4,096-sample buffer (2 s of arrivals) overflows long before a cut shows
    _, fixed = paced_run(pacing=True, delay_s=60.0, seconds=2400.0)
    _, grown = paced_run(pacing=True, delay_s=60.0, seconds=2400.0, most=1 << 20)
    assert fixed > 0.02, f"a fixed buffer of 4,096 wastes {fixed:.1%}"
    assert grown < 0.01, f"{grown:.1%} wasted with the buffer grown"
    _, capped = paced_run(pacing=True, delay_s=60.0, seconds=2400.0, most=8192)
    assert capped > grown, "max_buffer bounds the growth"


def test_the_buffer_grows_no_further_than_the_optimizer_trains_while_samples_stay_fresh():
    settings = BalanceSettings(batch=256, max_batch=256, target_reuse=1.0, publish_interval_s=2.0, buffer=4096,
                               pace_every_s=5.0, max_buffer=1 << 20, fresh_s=10.0)
    cpu = Balancer(settings)
    for t in range(1, 60):  # 2,000 samples/s arrive, 1,000/s trained, busy all the time
        d = cpu.step(float(t), received=2000 * t, consumed=1000 * t, wasted=0, backlog=3000, busy_s=1.0)
    assert d.buffer == 10240, "what trains in 10 s: more would only go stale"
    assert cpu.ceiling == 256
    gpu = Balancer(dataclasses.replace(settings, fresh_s=math.inf, batch_follows_buffer=True))
    for t in range(1, 60):
        d = gpu.step(float(t), received=2000 * t, consumed=1000 * t, wasted=0, backlog=3000, busy_s=1.0)
    assert d.buffer == 20480, "what arrives over two looks of the pace"
    assert gpu.s.max_batch == 10240 and settings.max_batch == 256, "the batch bound follows, on the balancer's copy"
    assert gpu.ceiling == 256, "a growth trial that did not pay still caps the batch"
