"""The S3 model's knobs on the scale model's command line, validated once into :class:`StoreSettings`.

    p = argparse.ArgumentParser(...); p.add_argument("--request-ms", ...); p.add_argument("--list-ms", ...)
    add_store_args(p)
    cfg = store_settings(p.parse_args())
    latency = cfg.latency(bandwidth, size_scale, seed)      # what Meter charges
    store = cfg.store(meter, seed)                          # the ModelStore

The means come from the caller's ``--request-ms`` (PUT, GET; HEAD and DELETE half of it) and ``--list-ms``
(a LIST page), or per op from ``--latency-ms``. The defaults that are assumptions, not measurements, say so.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .meter import OPS, Latency, Meter
from .s3rules import READ_LIMIT, WRITE_LIMIT
from .store import ModelStore

DEFAULT_SIGMA = 1.0
"""Lognormal shape of every op's latency: p99 = 10.2 × the median (e^(2.326 σ)), the tail the issue asks of
S3. An assumption: moto_server on loopback measures σ 0.1–0.5 (benchmarks/fleet/calibrate.py)."""
DEFAULT_ERROR_RATE = DEFAULT_RESET_RATE = 1e-4
"""Share of attempts answered 500 InternalError, and cut by a connection reset. An assumption: S3's SLA
allows 0.1% errors a month; 0.01% each is a quiet month."""
DEFAULT_SPLIT_AFTER_S = 120.0
"""Seconds of sustained load (half a partition's limit or more) before it splits. An assumption: AWS says
only that S3 scales a prefix gradually, over minutes."""


@dataclass(frozen=True)
class StoreSettings:
    mean_s: dict  # op → mean latency (seconds)
    sigma: dict  # op → lognormal shape
    list_key_s: float  # seconds a LIST page takes per key it returns
    error_rate: float
    reset_rate: float
    write_limit: float  # per partition, requests/s
    read_limit: float
    split_after_s: float  # 0: partitions never split

    def latency(self, bandwidth: float, size_scale: dict, seed: int = 0) -> Latency:
        return Latency(dict(self.mean_s), bandwidth, size_scale, sigma=dict(self.sigma),
                       per_key=self.list_key_s, seed=seed)

    def store(self, meter: Meter, seed: int = 0) -> ModelStore:
        return ModelStore(meter, self.write_limit, self.read_limit, seed=seed, error_rate=self.error_rate,
                          reset_rate=self.reset_rate, split_after_s=self.split_after_s)

    def describe(self) -> str:
        ms = ", ".join(f"{op} {1e3 * self.mean_s[op]:.3g}" for op in OPS)
        sig = ", ".join(f"{op} {self.sigma.get(op, 0.0):.2g}" for op in OPS)
        return (f"S3 model: mean ms {ms}; lognormal σ {sig}; LIST +{1e3 * self.list_key_s:.3g} ms a key; "
                f"500s {self.error_rate:.2%}, resets {self.reset_rate:.2%} of attempts; a partition "
                f"{self.write_limit:,.0f} writes/s, {self.read_limit:,.0f} reads/s, split after "
                + (f"{self.split_after_s:g} s of load" if self.split_after_s else "never"))


def _number(text: str, lo: float, hi: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{what} must be in [{lo:g}, {hi:g}], got {text!r}")
    return value


def _per_op(text: str, lo: float, hi: float, what: str, bare: bool) -> dict:
    """``OP=X,OP=X`` (ops among PUT GET LIST DELETE HEAD) or, where ``bare``, one X for every op."""
    if bare and "=" not in text:
        return dict.fromkeys(OPS, _number(text, lo, hi, what))
    out = {}
    for item in text.split(","):
        op, sep, value = item.partition("=")
        if not sep or op.strip().upper() not in OPS:
            raise argparse.ArgumentTypeError(f"{what}: expected OP=NUMBER with OP one of {', '.join(OPS)}, "
                                             f"got {item!r}")
        out[op.strip().upper()] = _number(value, lo, hi, what)
    return out


def add_store_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("S3 model (--store model)")
    g.add_argument("--latency-ms", type=lambda t: _per_op(t, 1e-3, 6e4, "--latency-ms", False), default={},
                   help="mean latency per op, OP=MS[,OP=MS…], over --request-ms / --list-ms for the ops named")
    g.add_argument("--latency-sigma", type=lambda t: _per_op(t, 0.0, 3.0, "--latency-sigma", True),
                   default=dict.fromkeys(OPS, DEFAULT_SIGMA),
                   help="lognormal shape of the latency, one for all ops or OP=S[,OP=S…]; p99 = e^(2.33 σ) × "
                        f"the median (default {DEFAULT_SIGMA:g}: 10×; 0: constant)")
    g.add_argument("--list-key-ms", type=lambda t: _number(t, 0.0, 1e3, "--list-key-ms"), default=0.0,
                   help="ms a LIST page takes per key it returns, beyond --list-ms")
    g.add_argument("--error-rate", type=lambda t: _number(t, 0.0, 0.5, "--error-rate"),
                   default=DEFAULT_ERROR_RATE, help="share of attempts answered 500 InternalError")
    g.add_argument("--reset-rate", type=lambda t: _number(t, 0.0, 0.5, "--reset-rate"),
                   default=DEFAULT_RESET_RATE, help="share of attempts cut by a connection reset")
    g.add_argument("--write-limit", type=lambda t: _number(t, 1.0, 1e9, "--write-limit"), default=WRITE_LIMIT,
                   help="writes/s one partition serves before SlowDown")
    g.add_argument("--read-limit", type=lambda t: _number(t, 1.0, 1e9, "--read-limit"), default=READ_LIMIT,
                   help="reads/s one partition serves before SlowDown")
    g.add_argument("--split-after-s", type=lambda t: _number(t, 0.0, 1e6, "--split-after-s"),
                   default=DEFAULT_SPLIT_AFTER_S,
                   help="seconds of sustained load before a partition splits (0: never)")


def store_settings(a: argparse.Namespace) -> StoreSettings:
    """The settings from parsed arguments: ``add_store_args``'s and the caller's ``request_ms``/``list_ms``."""
    mean_ms = {"PUT": a.request_ms, "GET": a.request_ms, "HEAD": a.request_ms / 2, "DELETE": a.request_ms / 2,
               "LIST": a.list_ms, **a.latency_ms}
    sigma = {**dict.fromkeys(OPS, DEFAULT_SIGMA), **a.latency_sigma}  # OP=S names some ops: the rest keep theirs
    return StoreSettings({op: ms / 1e3 for op, ms in mean_ms.items()}, sigma, a.list_key_ms / 1e3,
                         a.error_rate, a.reset_rate, a.write_limit, a.read_limit, a.split_after_s)
