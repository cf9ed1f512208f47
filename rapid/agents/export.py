"""`rapid export`: a trained policy as one file that runs with torch alone (TorchScript) or onnxruntime alone
(ONNX), the observation normalizer and the LSTM state handling built in.

The exported function, for n agents (one row each; a game's agents, or many games' together)::

    actions, logp, value, h, c = policy(obs, mask, h, c, first)

    obs    float32 [n, obs_dim]        the env's observation of each agent, as rapid's vector env gives it
    mask   bool    [n, sum(heads)]     allowed actions, the heads' masks side by side (all True: no mask)
    h, c   float32 [n, lstm]           the state the last call returned (zeros at first)
    first  bool    [n]                 the agent's game starts now: its state is zeroed before this step
    →
    actions int64   [n, len(heads)]    the most likely allowed action of each head
    logp    float32 [n, sum(heads)]    each head's log-probabilities (to sample: draw from exp(logp) per head)
    value   float32 [n]                the estimate of the agent's return from here, in reward units

The file says what it holds: its ``rapid.json`` (TorchScript: an extra file of the archive, ONNX: the model's
``metadata_props``) names the env, version, shapes and heads.

>>> import tempfile, torch
>>> from rapid.api import load_policy, publish_untrained
>>> from rapid.run.config_files import load_config
>>> policy = load_policy(publish_untrained(load_config(None, ["model.hidden=16", "model.lstm=16"]),
...                                        tempfile.mkdtemp()))
>>> path = export_policy(policy, "torchscript", tempfile.mkdtemp() + "/c4.pt")
>>> module = torch.jit.load(path)
>>> n = 3
>>> actions, logp, value, h, c = module(torch.zeros(n, 84), torch.ones(n, 7, dtype=torch.bool),
...                                     torch.zeros(n, 16), torch.zeros(n, 16), torch.ones(n, dtype=torch.bool))
>>> actions.shape, logp.shape, value.shape, h.shape
(torch.Size([3, 1]), torch.Size([3, 7]), torch.Size([3]), torch.Size([3, 16]))
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from rapid.api import TrainedPolicy
from rapid.errors import UsageError
from rapid.opt.model import NEG_INF, Policy

FORMATS = ("torchscript", "onnx")
ONNX_MAX_BYTES = 2 << 30
"""An ONNX file is one protobuf message, which cannot pass 2 GiB; larger weights need ONNX's external data,
which is more than one file."""
ONNX_OPSET = 17


class StandalonePolicy(nn.Module):
    """``Policy.act`` as one pure function of tensors: the normalizer's statistics frozen as float32
    constants, the state zeroed where a game starts, greedy actions and every head's log-probabilities."""

    # Buffers (register_buffer), declared so that type checkers see tensors, not nn.Module's attribute lookup.
    obs_mean: torch.Tensor
    obs_std: torch.Tensor
    return_scale: torch.Tensor

    def __init__(self, policy: Policy):
        super().__init__()
        mean, var = policy.obs_norm.applied()
        # The same float32 values RunningNorm.forward computes from its float64 statistics.
        self.register_buffer("obs_mean", mean.float().clone())
        self.register_buffer("obs_std", var.float().sqrt() + 1e-8)
        self.register_buffer("return_scale", policy.return_scale.float().reshape(1).clone())
        self.clip = float(policy.obs_norm.clip)
        self.heads = list(policy.action_heads)
        self.encoder, self.lstm = policy.encoder, policy.lstm
        self.logits, self.value_head = policy.logits, policy.value_head

    def forward(self, obs: torch.Tensor, mask: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                first: torch.Tensor):
        keep = (~first).to(h.dtype).unsqueeze(-1)
        z = ((obs - self.obs_mean) / self.obs_std).clamp(-self.clip, self.clip)
        x = self.encoder(z).unsqueeze(1)
        _, (h1, c1) = self.lstm(x, ((h * keep).unsqueeze(0), (c * keep).unsqueeze(0)))
        h1, c1 = h1[0], c1[0]
        logits = self.logits(h1).masked_fill(~mask, NEG_INF)
        logp = [part.log_softmax(-1) for part in logits.split(self.heads, -1)]
        actions = torch.stack([lp.argmax(-1) for lp in logp], -1)
        value = self.value_head(h1).squeeze(-1) * self.return_scale
        return actions, torch.cat(logp, -1), value, h1, c1


def description(policy: TrainedPolicy) -> dict:
    """What an exported file holds, as its rapid.json says."""
    spec = policy.spec
    return {"format": "rapid.exported_policy", "env": policy.env_name, "env_options": policy.config.env.options,
            "version": policy.version, "obs_dim": spec.obs_dim, "action_heads": list(spec.action_heads),
            "lstm": policy.model.lstm_size, "agents": list(spec.agent_names), "sides": list(spec.side_of_agent),
            "inputs": ["obs", "mask", "h", "c", "first"], "outputs": ["actions", "logp", "value", "h", "c"]}


def describe_file(path: Path) -> str:
    """One line for `rapid export`: what was written, read back from the file's own description."""
    if path.suffix == ".onnx" or path.read_bytes()[:4] != b"PK\x03\x04":  # a TorchScript archive is a zip
        import onnx

        meta = json.loads({p.key: p.value for p in onnx.load(str(path)).metadata_props}["rapid.json"])
    else:
        extra = {"rapid.json": ""}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.load(str(path), _extra_files=extra)
        meta = json.loads(extra["rapid.json"])
    heads = meta["action_heads"]
    return (f"wrote {path} ({path.stat().st_size / 1024:.0f} kB): {meta['env']} v{meta['version']}; inputs obs "
            f"[n, {meta['obs_dim']}], mask [n, {sum(heads)}], h and c [n, {meta['lstm']}], first [n]; outputs "
            f"actions [n, {len(heads)}] (heads {tuple(heads)}), logp, value, h, c")


def example_inputs(policy: TrainedPolicy, n: int = 2) -> tuple[torch.Tensor, ...]:
    spec, lstm = policy.spec, policy.model.lstm_size
    return (torch.zeros(n, spec.obs_dim), torch.ones(n, spec.mask_dim, dtype=torch.bool), torch.zeros(n, lstm),
            torch.zeros(n, lstm), torch.ones(n, dtype=torch.bool))


def export_policy(policy: TrainedPolicy, fmt: str, out: str | os.PathLike) -> Path:
    """Write ``policy`` as ``fmt`` (torchscript or onnx) to ``out``; UsageError for what the format cannot hold
    or a place that cannot be written."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    out = Path(out)
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: no folder {out.parent}")
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; name the file to write")
    module = StandalonePolicy(policy.model).eval()
    meta = json.dumps(description(policy))
    if fmt == "onnx":
        size = sum(t.numel() * t.element_size() for t in module.state_dict().values())
        if size >= ONNX_MAX_BYTES:
            raise UsageError(f"v{policy.version} holds {size / 2**30:.1f} GiB of weights; one ONNX file holds "
                             f"less than {ONNX_MAX_BYTES / 2**30:.0f} GiB: export it as torchscript")
        _write_onnx(module, example_inputs(policy), out, meta)
    else:
        # torch.jit is deprecated in favour of torch.export, whose files need torch's Python packaging to
        # run; TorchScript is what runs with torch (or libtorch) alone. The tracer's warnings are about
        # nn.LSTM's check of the state's size, which the inputs' shapes settle.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = torch.jit.trace(module, example_inputs(policy), check_trace=False)
            torch.jit.save(traced, str(out), _extra_files={"rapid.json": meta})
    return out


def _write_onnx(module: StandalonePolicy, inputs: tuple[torch.Tensor, ...], out: Path, meta: str) -> None:
    import onnx

    names = ["obs", "mask", "h", "c", "first"]
    outputs = ["actions", "logp", "value", "h_out", "c_out"]
    # The TorchScript-based exporter: deprecated, but it writes this small graph in a fraction of a second where
    # the torch.export-based one takes ~20 s and needs onnxscript. Its LSTM warning is about batch sizes with
    # a state that is not an input: here h and c are inputs.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", "Exporting a model to ONNX with a batch_size other than 1", UserWarning)
        torch.onnx.export(module, inputs, str(out), input_names=names, output_names=outputs, opset_version=ONNX_OPSET,
                          dynamic_axes={name: {0: "n"} for name in names + outputs}, dynamo=False)
    model = onnx.load(str(out))
    model.metadata_props.add(key="rapid.json", value=meta)
    onnx.save(model, str(out))
