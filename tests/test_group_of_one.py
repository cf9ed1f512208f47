"""One rank in a real process group (``optimizer.group_for_one``): the collectives of a many-rank job (float64
all-reduces, ``all_gather_bytes``, the agreement, the float64 buffer broadcast) run for real, so a one-GPU box
runs the NCCL paths under ``pytest -m cuda``; here the same tests run on gloo. Each test forms and destroys the
process group in this process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import rapid.infra.distributed as distributed
from rapid.cli import main
from rapid.infra.distributed import Identity, init_process_group
from rapid.run.config_files import load_config
from tests.test_optimizer_loop import plant

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
ONE = Identity(0, 1, 0, 1, "localhost", "none")


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.register_buffer("count", torch.tensor([2.0**53 - 1], dtype=torch.float64))  # exact in float64 only


@pytest.mark.parametrize("device", DEVICES)
def test_every_collective_runs_in_a_group_of_one(device):
    with init_process_group(ONE, device=device, group_for_one=True, timeout=30.0) as ctx:
        assert ctx.in_group and dist.is_initialized() and dist.get_world_size() == 1
        assert ctx.backend == ("nccl" if device == "cuda" else "gloo") and ctx.timeout_s == 30.0
        assert ctx.all_reduce_scalars({"n": 2.0**53 - 1, "b": 0.5}) == {"n": 2.0**53 - 1, "b": 0.5}
        assert ctx.all_gather_bytes(b"tally") == [b"tally"] and ctx.all_gather_bytes(b"") == [b""]
        model = WithBuffer().to(ctx.device)
        before = [t.detach().clone() for t in (*model.parameters(), *model.buffers())]
        ctx.broadcast_parameters(model)
        assert all(torch.equal(a, b) for a, b in zip(before, (*model.parameters(), *model.buffers())))
        model.linear.weight.grad = torch.full_like(model.linear.weight, 3.0)
        ctx.all_reduce_gradients(model.parameters())
        assert torch.equal(model.linear.bias.grad, torch.zeros_like(model.linear.bias))  # a missing grad: zeros
        assert torch.equal(model.linear.weight.grad, torch.full_like(model.linear.weight, 3.0))
        mean = torch.tensor([4.0, 6.0], dtype=torch.float64, device=ctx.device)
        ctx.all_reduce_mean_(mean)
        assert mean.tolist() == [4.0, 6.0]
        ctx.barrier()
    assert not dist.is_initialized() and not ctx.in_group


@pytest.mark.parametrize("device", DEVICES)
def test_the_optimizer_loop_runs_its_collectives_in_a_group_of_one(tmp_path, monkeypatch, capsys, device):
    sets = [f"run.dir='{tmp_path}'", "run.updates=3", "metrics.enabled=false", "model.hidden=16", "model.lstm=16",
            "model.encoder_layers=1", "rollout.bptt=4", "rollout.upload_interval_s=0.001",
            "optimizer.batch_samples=8", "optimizer.buffer_samples=256", "optimizer.decode_workers=0",
            "optimizer.poll_s=0.05", "optimizer.balance=false", "league.snapshot_every=0",
            f"optimizer.device='{device}'", "optimizer.group_for_one=true", "optimizer.collective_timeout_s=40"]
    plant(load_config(None, sets))
    calls: list[tuple[str, torch.dtype, str]] = []
    for name in ("all_reduce", "all_gather", "broadcast"):
        real = getattr(dist, name)

        def spy(first, *args, _name=name, _real=real, **kwargs):
            tensor = first[0] if isinstance(first, list) else first
            calls.append((_name, tensor.dtype, tensor.device.type))
            return _real(first, *args, **kwargs)
        monkeypatch.setattr(dist, name, spy)
    contexts = []
    real_init = distributed.init_process_group

    def recording_init(*args, **kwargs):
        contexts.append(real_init(*args, **kwargs))
        return contexts[-1]
    monkeypatch.setattr(distributed, "init_process_group", recording_init)
    assert main(["optimizer", *[arg for s in sets for arg in ("--set", s)]]) == 0, capsys.readouterr().err
    (ctx,) = contexts
    assert ctx.timeout_s == 40.0 and not ctx.in_group  # formed for the run, torn down after it
    kinds = {(name, dtype) for name, dtype, _ in calls}
    assert {("all_reduce", torch.float64),    # the agreement (and every other mean of scalars)
            ("all_reduce", torch.float32),    # the gradient buckets
            ("all_gather", torch.int64), ("all_gather", torch.uint8),  # all_gather_bytes: the games' tallies
            ("broadcast", torch.float32), ("broadcast", torch.float64)} <= kinds, kinds  # weights, normalizer
    assert {where for _, _, where in calls} == {device}
