"""TensorBoard and W&B curves (metrics.tensorboard, metrics.wandb): what the optimizer report and the evaluator
write, read back with TensorBoard's own reader and from W&B's offline run files.

About 2 s for the unit test; the `rapid train --in-process` run about 12 s on 2 cores."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rapid.formats.experience import Shape
from rapid.infra.store import LocalStore
from rapid.monitoring.optimizer_metrics import OptimizerMetrics
from rapid.opt.buffer import ExperienceBuffer
from rapid.optimizer.balance import Balancer, BalanceSettings
from rapid.optimizer.loader import ExperienceLoader
from rapid.roles.curves import open_curves
from rapid.roles.optimizer_report import OptimizerReport
from tests.helpers import rapid
from tests.test_train_e2e import FAST


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_history(run_file: Path) -> list[dict]:
    """The rows a W&B offline run logged: its .wandb file is a LevelDB-format log (7-byte block headers:
    checksum, length, fragment kind) of wandb_internal Record messages."""
    from wandb.proto import wandb_internal_pb2

    data, pos, part, rows = run_file.read_bytes(), 7, b"", []  # after the file's own 7-byte header
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last fragment of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            part = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
    return rows


def test_optimizer_report_writes_its_record_as_curves(tmp_path):
    buffer = ExperienceBuffer(capacity=64, max_staleness=8)
    loader = ExperienceLoader(LocalStore(tmp_path), Shape(bptt=4, obs_dim=3, mask_dim=2, heads=1, lstm=8), buffer)
    curves = open_curves(tmp_path, "optimizer", run_name="demo", tensorboard=True, wandb="")
    report = OptimizerReport(OptimizerMetrics(run="demo"), None, buffer, loader, curves=curves)
    balance = Balancer(BalanceSettings(batch=2, max_batch=8, target_reuse=1.0, publish_interval_s=2.0))
    for update, loss in ((1, 0.5), (2, 0.25)):
        stats = {"policy_loss": loss, "entropy": 1.5, "forward_s": 0.01, "backward_s": 0.02, "allreduce_s": 0.0,
                 "step_s": 0.01}
        decision = balance.step(float(update), received=0, consumed=0, wasted=0, backlog=0, busy_s=0.04)
        report.update(update, 10 + update, stats, np.array([0, 3]), decision, 0.005)
    report.close()
    scalars = tensorboard_scalars(tmp_path / "logs" / "tb")
    assert scalars["loss/policy"] == [(1, 0.5), (2, 0.25)]
    assert scalars["version"] == [(1, 11.0), (2, 12.0)]
    assert scalars["balance/staleness_mean"] == [(1, 1.5), (2, 1.5)]
    assert [s for s, _ in scalars["throughput/env_steps_per_s"]] == [2], "a rate needs two records"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A short `rapid train --in-process` with the evaluator on and W&B offline: TensorBoard is on by default. It
    stops at the first evaluation with a win (an untrained policy loses all 20 games to random about once in a
    million runs), so at least one evaluation is written however loaded the machine is."""
    run = tmp_path_factory.mktemp("curves") / "c4"
    rapid("train", "--in-process", "--config", "configs/default.toml", "--run-dir", str(run), "--minutes", "3",
          "--set", "run.target_win_rate=0.01", "--workers", "1", "--no-progress", *FAST, "--set", "eval.interval_s=0.5",
          "--set", "eval.games=20", "--set", 'eval.play="both"',
          "--set", "eval.pool_games=0", "--set", "model.hidden=32", "--set", "model.lstm=32",
          "--set", 'metrics.wandb="offline"', timeout=240)
    return run


def test_the_evaluator_writes_tensorboard_and_wandb_curves(trained):
    """Sampled and greedy (``eval.play = "both"``) each have their curve; the sampled match is the rated one."""
    rows = [json.loads(line) for line in (trained / "logs" / "eval.jsonl").read_text().splitlines()]
    evals, greedy = [e for e in rows if not e["greedy"]], [e for e in rows if e["greedy"]]
    assert evals and [e["version"] for e in greedy] == [e["version"] for e in evals]
    scalars = tensorboard_scalars(trained / "logs" / "tb")
    assert scalars["eval/win_rate_vs_random"] == [(e["version"], pytest.approx(e["win_rate"])) for e in evals]
    assert scalars["eval/win_rate_vs_random_greedy"] == [(e["version"], pytest.approx(e["win_rate"])) for e in greedy]
    assert [s for s, _ in scalars["eval/rating"]] == [e["version"] for e in evals if "rating" in e]
    [evaluator_run] = (trained / "logs" / "wandb").glob("offline-run-*-evaluator/run-*.wandb")
    rows = [r for r in wandb_history(evaluator_run) if "eval/win_rate_vs_random" in r]
    assert [(r["step"], r["eval/win_rate_vs_random"]) for r in rows] == [
        (e["version"], pytest.approx(e["win_rate"])) for e in evals]


def test_the_optimizer_writes_tensorboard_and_wandb_curves(trained):
    """The run may stop at its first evaluation before any update (a win against random is easy): the optimizer's
    curves then exist and are empty; every record it wrote is a point of them."""
    ops = [json.loads(line) for line in (trained / "logs" / "optimizer.jsonl").read_text().splitlines()]
    assert len(list((trained / "logs" / "tb").glob("events.out.tfevents.*.optimizer"))) == 1  # rank 0 wired
    scalars = tensorboard_scalars(trained / "logs" / "tb")
    assert scalars.get("loss/policy", []) == [(o["update"], pytest.approx(o["policy_loss"])) for o in ops]
    if ops:
        assert {"loss/approx_kl", "loss/entropy", "throughput/samples_per_s", "balance/sample_reuse"} <= set(scalars)
    [optimizer_run] = (trained / "logs" / "wandb").glob("offline-run-*-optimizer/run-*.wandb")
    rows = [r for r in wandb_history(optimizer_run) if "loss/policy" in r]
    assert [r["step"] for r in rows] == [o["update"] for o in ops]
