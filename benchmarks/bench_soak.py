"""Soak: a live `rapid train` on Connect Four while hostile objects are planted in its store.

    OMP_NUM_THREADS=1 python benchmarks/bench_soak.py [--minutes 4] [--every 1.0] [--seed 0] [--run-dir DIR]

Every ``--every`` seconds one object from a random mix is planted in the run's experience shard
(``experience/s0000/``, the one shard of a one-rank run) or under ``params/``: truncated, bit-flipped and
re-sealed copies of the run's own objects, amplifying msgpack (nested empty containers), out-of-range actions,
actions the mask forbids, versions from the future, negative counts, huge declared sizes (8 GB sparse files,
4-billion-entry headers), FIFOs, links to /dev/zero and odd names. Prints what was planted, the bad objects
the optimizer counted, the versions published over time, role restarts, tracebacks in the logs, and each
role's peak RSS (VmHWM). The run must publish versions throughout and its memory must stay bounded.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import msgpack
import numpy as np

from rapid.errors import FormatError
from rapid.formats import codec, experience

ROOT = Path(__file__).resolve().parents[1]
FAR = 10 ** 11  # planted params versions far beyond any the run publishes: they never collide with one
PLANTED = "9999999999zz"


def nested_empty(nbytes: int) -> bytes:
    per = 4096
    width = max(1, nbytes // (per + 3))
    return b"\xdd" + width.to_bytes(4, "big") + (b"\xdc" + per.to_bytes(2, "big") + b"\x90" * per) * width


def seal(fmt: str, payload: bytes) -> bytes:
    return msgpack.packb([fmt, 1, zlib.crc32(payload), payload], use_bin_type=True)


class Planter:
    """Plants one hostile object at a time into a local store folder."""

    def __init__(self, store: Path, rng: random.Random):
        self.store, self.rng = store, rng
        self.planted: collections.Counter[str] = collections.Counter()
        self.n = 0

    def _real_experience(self) -> bytes | None:
        objs = sorted(p for p in (self.store / "experience").glob("s*/*.rxp") if not p.name.startswith(PLANTED))
        for path in reversed(objs[-20:]):
            try:
                if stat.S_ISREG(path.lstat().st_mode):  # never our own FIFOs and links
                    data = path.read_bytes()
                    msgpack.unpackb(data, raw=False)  # a whole object, not one of our odd-named stubs
                    return data
            except (OSError, ValueError):
                continue  # removed by retention meanwhile, or planted
        return None

    def _edited(self, data: bytes, edit) -> bytes:
        """Decode a real object (against its own shape), edit it, re-encode: valid envelope, bad values."""
        tree = msgpack.unpackb(msgpack.unpackb(data, raw=False)[3], raw=False, strict_map_key=False,
                               ext_hook=lambda c, b: msgpack.ExtType(c, b))
        arrays = {}
        for k, ext in tree["arrays"].items():
            dtype, shape, raw = msgpack.unpackb(ext.data, raw=False)
            arrays[k] = np.frombuffer(raw, dtype).reshape(shape).copy()
        batch = experience.ExperienceBatch(tree["worker"], tree["seq"], tree["created"], arrays, tree["opponents"],
                                           tree["episodes"], tree["env_steps"])
        edit(batch)
        # A hostile writer's bytes: encode_experience itself refuses what the readers refuse.
        return codec.encode(experience.FORMAT, experience.FORMAT_VERSION, {
            "worker": batch.worker, "seq": batch.seq, "created": batch.created, "arrays": batch.arrays,
            "opponents": batch.opponents, "episodes": batch.episodes, "env_steps": batch.env_steps})

    def _path(self, area: str, name: str) -> Path:
        folder = self.store / area
        folder.mkdir(parents=True, exist_ok=True)
        return folder / name

    def plant(self) -> str:
        self.n += 1
        area, kind = self.rng.choice([("experience/s0000", k) for k in EXPERIENCE_KINDS]
                                     + [("params", k) for k in OTHER_KINDS])
        ext = {"params": ".rpm"}.get(area, ".rxp")
        name = f"{FAR + self.n:012d}{ext}" if area == "params" else f"{PLANTED}-{self.n:08d}{ext}"
        path = self._path(area, name)
        real = self._real_experience() or seal(experience.FORMAT, b"\x80")
        if kind == "truncated":
            path.write_bytes(real[: self.rng.randrange(1, len(real))])
        elif kind == "bit-flipped":
            b = bytearray(real)
            for _ in range(self.rng.randint(1, 8)):
                b[self.rng.randrange(len(b))] ^= 1 << self.rng.randrange(8)
            path.write_bytes(bytes(b))
        elif kind == "resealed-garbage":
            payload = bytearray(msgpack.unpackb(real, raw=False)[3])
            for _ in range(self.rng.randint(1, 8)):
                payload[self.rng.randrange(len(payload))] = self.rng.randrange(256)
            path.write_bytes(seal(experience.FORMAT, bytes(payload)))
        elif kind == "amplifying":
            fmt = {".rpm": "rapid.params"}.get(ext, experience.FORMAT)
            path.write_bytes(seal(fmt, nested_empty(self.rng.choice([1, 4, 16]) << 20)))
        elif kind == "huge-declared-count":
            path.write_bytes(seal(experience.FORMAT, b"\xdd\xff\xff\xff\xff" + b"\x90" * 1000))
        elif kind == "action-out-of-range":
            path.write_bytes(self._edited(real, lambda b: b.arrays["actions"].__setitem__(
                (0, 0, 0), self.rng.choice([99, -1, 7]))))
        elif kind == "mask-forbids-action":
            def forbid(b):
                a = int(b.arrays["actions"][0, 0, 0])
                b.arrays["active"][0, 0] = True
                b.arrays["mask"][0, 0, a] = False
                if not b.arrays["mask"][0, 0].any():
                    b.arrays["mask"][0, 0, (a + 1) % b.arrays["mask"].shape[-1]] = True
            path.write_bytes(self._edited(real, forbid))
        elif kind == "future-version":
            path.write_bytes(self._edited(real, lambda b: b.arrays["version"].fill(10 ** 9)))
        elif kind == "negative-counts":
            path.write_bytes(self._edited(real, lambda b: setattr(b, "env_steps", -10 ** 6)))
        elif kind == "sparse-8GB":
            with open(path, "wb") as f:
                f.truncate(8 << 30)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "dev-zero":
            os.symlink("/dev/zero", path)
        elif kind == "odd-name":
            odd = self.rng.choice(["²³", "٣٤", "a b", "-x", ".hidden", "x\udcff"])
            target = os.fsencode(str(path.parent / f"{odd}{self.n}{ext}"))  # distinct, so each is countable
            with open(target, "wb") as f:
                f.write(real[:64])
        else:
            path.write_bytes(os.urandom(self.rng.randrange(1, 4096)))
        self.planted[f"{area.split('/')[0]}:{kind}"] += 1
        return kind


EXPERIENCE_KINDS = ["truncated", "bit-flipped", "resealed-garbage", "amplifying", "huge-declared-count",
                    "action-out-of-range", "mask-forbids-action", "future-version", "negative-counts",
                    "sparse-8GB", "fifo", "dev-zero", "odd-name"]
OTHER_KINDS = ["garbage", "truncated", "amplifying", "sparse-8GB", "fifo", "dev-zero", "odd-name"]


def role_pids(run_dir: Path) -> dict[str, int]:
    """role → pid of this run's processes (by their command lines)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(argv).decode(errors="replace")
        if "rapid.cli" in text and str(run_dir) in text:
            role = argv[argv.index(b"rapid.cli") + 1].decode() if b"rapid.cli" in argv else "?"
            worker = re.search(r"--worker-id (\S+)", text)
            out[role + (f"-{worker.group(1)}" if worker else "")] = int(entry.name)
    return out


def peak_rss_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(m.group(1)) / 1024 if m else None


def latest_version(store: Path) -> int | None:
    try:
        return int((store / "params" / "LATEST").read_text().strip())
    except (OSError, ValueError):
        return None


def last_jsonl(path: Path) -> dict:
    try:
        lines = path.read_text().strip().splitlines()
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--every", type=float, default=1.0, help="seconds between planted objects (0: none, a baseline)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="rapid-soak-")).resolve()
    if args.run_dir is None:
        shutil.rmtree(run_dir)
    store = run_dir / "store"
    cmd = [sys.executable, "-m", "rapid.cli", "train", "--config", str(ROOT / "configs/default.toml"),
           "--run-dir", str(run_dir), "--minutes", str(args.minutes), "--no-progress", "--workers", "1",
           "--set", "eval.games=50", "--set", "store.retention_s=60"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(run_dir.parent / f"{run_dir.name}-train.out", "w")
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    planter = Planter(store, rng)
    timeline: list[tuple[int, int | None]] = []
    peaks: dict[str, float] = {}
    planted_bytes = 0
    next_sample = 0.0
    try:
        while proc.poll() is None:
            now = time.time() - started
            # Planting stops 20 s before the time limit, so the optimizer has polled every object it could
            # count by the time it stops.
            planting = args.every > 0 and now < 60 * args.minutes - 20
            started_up = store.joinpath("params", "LATEST").exists() and any((store / "experience").glob("w*/*.rxp"))
            if planting and started_up:
                try:
                    planter.plant()
                except (OSError, FormatError, ValueError, KeyError) as e:
                    planter.planted[f"plant-failed:{type(e).__name__}"] += 1
            if now >= next_sample:
                timeline.append((round(now), latest_version(store)))
                next_sample = now + 15
            for role, pid in role_pids(run_dir).items():
                rss = peak_rss_mib(pid)
                if rss is not None:
                    peaks[role] = max(peaks.get(role, 0.0), rss)
            time.sleep(args.every or 1.0)
        code = proc.returncode
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        log.close()
    timeline.append((round(time.time() - started), latest_version(store)))
    final = last_jsonl(run_dir / "logs" / "optimizer.jsonl")
    for path in store.rglob("*"):
        if "zz-hostile" in str(path) or path.name.startswith(str(FAR)[:3]):
            try:
                planted_bytes += path.lstat().st_size
            except OSError:
                pass
    logs = {p.name: p.read_text(errors="replace") for p in (run_dir / "logs").glob("*.log")}
    train_out = (run_dir.parent / f"{run_dir.name}-train.out").read_text(errors="replace")
    print(f"soak: {args.minutes:g} min of `rapid train` (connect four, 1 rollout worker) in {run_dir}; "
          f"exit code {code}")
    print(f"planted {planter.n} hostile objects ({planted_bytes / 2**30:.0f} GiB apparent size, mostly sparse):")
    for kind, n in sorted(planter.planted.items()):
        print(f"  {kind:40s} {n}")
    unlisted = ("fifo", "dev-zero")  # not regular files: never listed, so never counted
    countable = sum(n for k, n in planter.planted.items() if k.startswith("experience:") and k[11:] not in unlisted)
    print(f"optimizer: bad objects counted {final.get('bad_objects')} of {countable} listable experience objects "
          f"planted, updates {final.get('update')}, final version {final.get('version')}, "
          f"skipped updates {final.get('skipped_updates')}")
    print("versions published over time (seconds: LATEST): "
          + ", ".join(f"{t}s: v{v}" for t, v in timeline))
    print("peak RSS (VmHWM, MiB): " + ", ".join(f"{r} {m:.0f}" for r, m in sorted(peaks.items())))
    restarts = re.findall(r"(\S+) exited with code (-?\d+)", train_out)
    print(f"role restarts: {len(restarts)} {restarts[:5]}")
    for name, text in sorted(logs.items()):
        print(f"  {name}: {text.count('Traceback')} tracebacks, {len(re.findall(r' (WARNING|ERROR) ', text))} "
              f"warnings/errors")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
