"""Measure the CPU costs the scale model charges (``standins.Costs``) on this machine.

    python benchmarks/fleet/costs.py            # prints each figure and the Costs(...) line to record

- decode: ``decode_experience`` of a ~32 MB experience object (rapid's checks included), per MB;
- a LIST page: botocore parsing a ListObjectsV2 answer of 1,000 keys (what the loader pays per page on S3);
- encode: ``encode_params`` of a ~39 MB params object (publish, snapshot, checkpoint), per MB;
- the pool's JSON: ``dump_pool`` + ``load_pool`` of a 64-member pool, per KB.

Each is the best of a few runs of ``time.process_time`` (CPU, not wall: the model charges CPU).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent.parent))  # benchmarks/, for fleet.*

from fleet.standins import Costs  # noqa: E402
from rapid.formats.experience import ExperienceBatch, Shape, decode_experience, encode_experience  # noqa: E402
from rapid.formats.params import ParamsObject, encode_params  # noqa: E402
from rapid.league.state import Member, PoolState, add_member, dump_pool, load_pool  # noqa: E402


def best(fn, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def decode_s_per_mb() -> float:
    shape = Shape(bptt=16, obs_dim=237, mask_dim=32, heads=2, lstm=64, head_sizes=(9, 23))  # about moba 5v5

    def batch(n: int) -> ExperienceBatch:
        arrays = {k: np.zeros((n, *d), t) for k, (t, d) in shape.fields().items()}
        arrays["mask"][:] = True
        arrays["active"][:] = True
        return ExperienceBatch("w0", 0, 0.0, arrays, ["latest"])

    data = encode_experience(batch(max(1, int(32e6 / len(encode_experience(batch(1)))))))
    return best(lambda: decode_experience(data, shape)) / (len(data) / 1e6)


def list_page_s() -> float:
    import boto3
    from botocore.parsers import create_parser

    model = boto3.session.Session(region_name="us-east-1").client(
        "s3", aws_access_key_id="x", aws_secret_access_key="x").meta.service_model.operation_model("ListObjectsV2")
    contents = "".join(f"<Contents><Key>experience/s0001/{1700000000000 + i}-w{i}-abc-{i}.rxp</Key>"
                       f"<LastModified>2026-11-25T00:00:00.000Z</LastModified><ETag>&quot;x&quot;</ETag>"
                       f"<Size>33554432</Size><StorageClass>STANDARD</StorageClass></Contents>" for i in range(1000))
    body = (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
            f'2006-03-01/"><Name>b</Name><Prefix>experience/s0001/</Prefix><KeyCount>1000</KeyCount><MaxKeys>'
            f"1000</MaxKeys><IsTruncated>true</IsTruncated>{contents}</ListBucketResult>").encode()
    parser = create_parser("rest-xml")
    response = {"status_code": 200, "headers": {}, "body": body}
    return best(lambda: parser.parse(response, model.output_shape))


def encode_s_per_mb() -> float:
    tensors = {f"layer{i}": np.ones(1_000_000, np.float32) for i in range(10)}  # ~40 MB
    obj = ParamsObject(1, tensors, {"updates": 1})
    size = len(encode_params(obj))
    return best(lambda: encode_params(obj)) / (size / 1e6)


def pool_json_s_per_kb() -> float:
    state = PoolState()
    for v in range(64):
        state = add_member(state, Member(id=f"v{v:012d}", kind="snapshot", version=v, games=100, wins=50))
    blob = dump_pool(state)
    return best(lambda: load_pool(dump_pool(state))) / (len(blob) / 1e3)


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    figures = {"decode_s_per_mb": decode_s_per_mb(), "list_page_s": list_page_s(),
               "encode_s_per_mb": encode_s_per_mb(), "pool_json_s_per_kb": pool_json_s_per_kb()}
    for name, value in figures.items():
        print(f"{name:<20}{value * 1e3:10.3f} ms")
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    print(Costs(**{k: float(f"{v:.2g}") for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
