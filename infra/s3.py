"""S3-compatible object store (AWS, MinIO, Ceph, moto_server) behind the :class:`Store` interface.

Against a real server the store is ``open_store("s3://bucket/runs/demo")`` (or ``S3Store(url, endpoint_url=…)``);
``put_if_absent`` is a PUT with ``IfNoneMatch='*'``.

Usage::

    >>> from rapid.infra.store import open_store
    >>> from moto import mock_aws                        # an in-process S3 for this example (a test dependency)
    >>> s3 = mock_aws()
    >>> s3.start()
    >>> store = open_store("s3://bucket/runs/demo", region="us-east-1", create_bucket=True)   # or S3Store(…)
    >>> store.put("experience/w0/000001.rxp", b"rows")   # one PUT (multipart above multipart_threshold)
    >>> store.put_if_absent("params/000000000007.rpm", b"v7"), store.put_if_absent("params/000000000007.rpm", b"x")
    (True, False)
    >>> for key in store.list("experience/"):           # paginated, sorted, relative to the prefix
    ...     data = store.get(key)
    ...     store.delete(key)
    >>> data, store.list("")
    (b'rows', ['params/000000000007.rpm'])
    >>> print(store.describe())                          # e.g. s3://bucket/runs/demo @ http://127.0.0.1:9000
    s3://bucket/runs/demo @ ...
    >>> s3.stop()

Endpoint, region and credentials come from the standard AWS mechanisms (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, instance roles…); the keyword arguments
only override them. Transient failures are retried by botocore's own retry modes (``standard`` or
``adaptive``), never by a loop here. Every failure other than "not found" is raised as a one-line
:class:`StoreError` that names the operation, key and endpoint but never credentials.

Atomicity: S3 makes an object visible only when its PUT (or CompleteMultipartUpload) succeeds, so readers
see whole objects or nothing. ``put_if_absent`` is a single conditional PUT (objects up to 5 GB).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import boto3
import boto3.exceptions
import boto3.s3.transfer
import botocore.config
import botocore.exceptions

from rapid.infra.store import (
    DEFAULT_MAX_BYTES,
    InvalidKey,
    KeyNotFound,
    ObjectTooLarge,
    Store,
    StoreError,
    validate_key,
    validate_prefix,
)

MiB = 1024 * 1024

#: ``observer(op, nbytes, seconds, ok)``: called once after every store operation (ok=False if it raised).
Observer = Callable[[str, int, float, bool], None]

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_NO_BUCKET = {"NoSuchBucket"}
_PRECONDITION = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
# Access key ids have a fixed shape; scrub them (and URL user-info) from any message we re-raise, in case
# a backend or proxy echoes them back.
_ACCESS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA)[A-Z0-9]{12,}\b")
_URL_USERINFO = re.compile(r"(//)[^/@\s]+@")


def _redact(text: str) -> str:
    text = _URL_USERINFO.sub(r"\1***@", text)
    return _ACCESS_KEY_ID.sub("***", text)


# At DEBUG these SDK loggers print whole signed requests: the access key id, the session token and the
# signature. No log level of ours may print a credential, so they never log below WARNING.
_SDK_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


def quiet_sdk_loggers() -> None:
    for name in _SDK_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:  # NOTSET too: it would inherit the root's DEBUG
            logger.setLevel(logging.WARNING)


def _safe_endpoint(url: str | None) -> str:
    if not url:
        return "default endpoint"
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _error_code(e: botocore.exceptions.ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


@dataclass
class _Call:
    nbytes: int = 0


class S3Store(Store):
    """Objects under ``s3://bucket/prefix``; every key is validated and placed under the prefix."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        max_attempts: int = 5,
        retry_mode: str = "standard",
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        multipart_threshold: int = 64 * MiB,
        multipart_chunksize: int = 16 * MiB,
        max_pool_connections: int = 16,
        addressing_style: str = "path",
        create_bucket: bool = False,
        observer: Observer | None = None,
    ):
        if not url.startswith("s3://"):
            raise InvalidKey(f"not an S3 URL: {url!r} (expected s3://bucket/prefix)")
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
            raise InvalidKey(f"invalid S3 bucket name {bucket!r} in {url!r}")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        if retry_mode not in ("standard", "adaptive", "legacy"):
            raise ValueError(f"retry_mode must be 'standard', 'adaptive' or 'legacy', got {retry_mode!r}")
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.observer = observer
        self.multipart_threshold = multipart_threshold
        config = botocore.config.Config(
            region_name=region,
            retries={"mode": retry_mode, "max_attempts": max_attempts},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            # Path style works with every S3-compatible server (IP endpoints, MinIO without wildcard DNS).
            s3={"addressing_style": addressing_style},
        )
        quiet_sdk_loggers()
        try:
            session = boto3.session.Session(profile_name=profile)
            self._client = session.client("s3", endpoint_url=endpoint_url, config=config)
        except (botocore.exceptions.BotoCoreError, ValueError) as e:  # unknown profile, malformed endpoint
            raise StoreError(_redact(f"cannot set up S3 client for {self.url}: {type(e).__name__}: {e}")) from e
        self._transfer = boto3.s3.transfer.TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=max(1, max_pool_connections // 2),
        )
        if create_bucket:
            self._ensure_bucket()

    # -- helpers ---------------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    @property
    def client(self):
        """The boto3 client (for instrumentation, e.g. botocore's event hooks; the store's methods are the API)."""
        return self._client

    def describe(self) -> str:
        return f"{self.url} @ {_safe_endpoint(self._client.meta.endpoint_url)}"

    def _fail(self, op: str, key: str, e: Exception) -> StoreError:
        if isinstance(e, botocore.exceptions.ClientError):
            detail = f"{_error_code(e)}: {e.response.get('Error', {}).get('Message', '') or e}"
        else:
            detail = f"{type(e).__name__}: {e}"
        where = f"{op} {key!r}" if key else op
        line = " ".join(f"s3 {where} failed on {self.describe()}: {detail}".split())
        return StoreError(_redact(line))

    @contextlib.contextmanager
    def _call(self, op: str, key: str = "", nbytes: int = 0) -> Iterator[_Call]:
        """Time one operation, turn boto errors into StoreError/KeyNotFound, report to the observer."""
        call = _Call(nbytes)
        start = time.perf_counter()
        ok = False
        try:
            yield call
            ok = True
        except botocore.exceptions.ClientError as e:
            if _error_code(e) in _NOT_FOUND:
                raise KeyNotFound(key) from e
            raise self._fail(op, key, e) from e
        except (botocore.exceptions.BotoCoreError, boto3.exceptions.Boto3Error) as e:
            raise self._fail(op, key, e) from e
        finally:
            if self.observer is not None:
                self.observer(op, call.nbytes, time.perf_counter() - start, ok)

    def _ensure_bucket(self) -> None:
        with self._call("create_bucket"):
            try:
                self._client.head_bucket(Bucket=self.bucket)
                return
            except botocore.exceptions.ClientError as e:
                if _error_code(e) not in _NOT_FOUND | _NO_BUCKET:
                    raise
            region = self._client.meta.region_name
            kwargs = {}
            if region and region != "us-east-1":  # us-east-1 rejects an explicit LocationConstraint
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
            try:
                self._client.create_bucket(Bucket=self.bucket, **kwargs)
            except botocore.exceptions.ClientError as e:
                if _error_code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

    # -- Store interface -------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        full = self._key(key)
        data = bytes(data)
        with self._call("put", key, len(data)):
            if len(data) < self.multipart_threshold:
                self._client.put_object(Bucket=self.bucket, Key=full, Body=data)
            else:
                self._client.upload_fileobj(io.BytesIO(data), self.bucket, full, Config=self._transfer)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        full = self._key(key)
        data = bytes(data)
        with self._call("put_if_absent", key, len(data)) as call:
            try:
                self._client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
            except botocore.exceptions.ClientError as e:
                # 412: the object exists; 409: a concurrent conditional write to the same key is in flight.
                if _error_code(e) not in _PRECONDITION:
                    raise
                call.nbytes = 0
                return False
        return True

    def get(self, key: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        full = self._key(key)
        with self._call("get", key) as call:
            response = self._client.get_object(Bucket=self.bucket, Key=full)
            with response["Body"] as body:
                size = response.get("ContentLength")
                if not isinstance(size, int) or size > max_bytes:
                    raise ObjectTooLarge(f"s3 object {key!r} is {size} bytes, more than the {max_bytes} allowed")
                data = body.read(max_bytes + 1)  # never more than the limit, whatever the header said
            if len(data) > max_bytes:
                raise ObjectTooLarge(f"s3 object {key!r} is more than the {max_bytes} bytes allowed")
            call.nbytes = len(data)
        return data

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        validate_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        after = {"StartAfter": root + start_after} if start_after else {}
        with self._call("list", prefix):
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix, **after):
                keys.extend(obj["Key"][len(root):] for obj in page.get("Contents", ()))
        return sorted(keys)

    def delete(self, key: str) -> None:
        full = self._key(key)
        with self._call("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=full)

    def exists(self, key: str) -> bool:
        full = self._key(key)
        with self._call("exists", key):
            try:
                self._client.head_object(Bucket=self.bucket, Key=full)
            except botocore.exceptions.ClientError as e:
                if _error_code(e) in _NOT_FOUND:
                    return False
                raise
        return True
