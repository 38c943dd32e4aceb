"""S3-compatible destinations for backups (BAK-04), through boto3.

A remote is an `s3://bucket/prefix` URL; the endpoint, region and keys are the registry's
`backup.s3_*` entries, so one set serves every remote (an S3-compatible server such as
MinIO or Garage sets `backup.s3_endpoint_url`). A backup goes up as two objects, the file and
its manifest, under the remote's prefix with the same names as on disk.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

MANIFEST_SUFFIX = ".manifest.json"


class RemoteError(Exception):
    """A remote that cannot be used, said in a sentence."""


@dataclass(frozen=True)
class Remote:
    bucket: str
    prefix: str  # "" or ending in "/"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"


def parse(url: str) -> Remote:
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise RemoteError(f"{url!r} is not a remote: write s3://bucket/prefix")
    prefix = parsed.path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return Remote(parsed.netloc, prefix)


def split_object_url(url: str) -> tuple[Remote, str]:
    """`s3://bucket/prefix/name` -> (the remote `s3://bucket/prefix/`, `name`)."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc or not parsed.path.strip("/"):
        raise RemoteError(f"{url!r} names no backup: write s3://bucket/prefix/<backup file>")
    folder, _, name = parsed.path.lstrip("/").rpartition("/")
    return Remote(parsed.netloc, f"{folder}/" if folder else ""), name


def client(*, endpoint_url: str, region: str, access_key: str, secret_key: str):
    import boto3  # noqa: PLC0415  # boto3 loads only when a remote is used
    from botocore.config import Config  # noqa: PLC0415  # boto3 loads only when a remote is used

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or None,
        region_name=region or None,
        aws_access_key_id=access_key or None,
        aws_secret_access_key=secret_key or None,
        # Path-style addressing: what S3-compatible servers on a bare host name expect.
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def _explain(exc: Exception, what: str) -> RemoteError:
    from botocore.exceptions import ClientError  # noqa: PLC0415  # boto3 loads only when a remote is used

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return RemoteError(f"{what}: {error.get('Code', '?')} {error.get('Message', '')}".strip())
    # boto3's transfer errors (S3UploadFailedError) quote the server's code and message.
    return RemoteError(f"{what}: {exc}")


def upload(s3, remote: Remote, path: Path, *, progress: Callable[[int], None] | None = None):
    from boto3.exceptions import Boto3Error  # noqa: PLC0415  # boto3 loads only when a remote is used
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415  # boto3 loads only when a remote is used

    try:
        s3.upload_file(str(path), remote.bucket, remote.key(path.name), Callback=progress)
    except (Boto3Error, BotoCoreError, ClientError, OSError) as exc:
        raise _explain(exc, f"uploading {path.name} to {remote.url}") from None


def download(
    s3, remote: Remote, name: str, target: Path, *, progress: Callable[[int], None] | None = None
) -> None:
    from boto3.exceptions import Boto3Error  # noqa: PLC0415  # boto3 loads only when a remote is used
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415  # boto3 loads only when a remote is used

    try:
        s3.download_file(remote.bucket, remote.key(name), str(target), Callback=progress)
    except (Boto3Error, BotoCoreError, ClientError, OSError) as exc:
        target.unlink(missing_ok=True)
        raise _explain(exc, f"downloading {name} from {remote.url}") from None


def size(s3, remote: Remote, name: str) -> int:
    from boto3.exceptions import Boto3Error  # noqa: PLC0415  # boto3 loads only when a remote is used
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415  # boto3 loads only when a remote is used

    try:
        return int(s3.head_object(Bucket=remote.bucket, Key=remote.key(name))["ContentLength"])
    except (Boto3Error, BotoCoreError, ClientError) as exc:
        raise _explain(exc, f"looking up {name} at {remote.url}") from None


def manifests(s3, remote: Remote) -> list[str]:
    """The manifest names directly under the remote's prefix."""
    from boto3.exceptions import Boto3Error  # noqa: PLC0415  # boto3 loads only when a remote is used
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415  # boto3 loads only when a remote is used

    names = []
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=remote.bucket, Prefix=remote.prefix, Delimiter="/"
        )
        for page in pages:
            for item in page.get("Contents", []):
                name = item["Key"][len(remote.prefix) :]
                if name.endswith(MANIFEST_SUFFIX):
                    names.append(name)
    except (Boto3Error, BotoCoreError, ClientError) as exc:
        raise _explain(exc, f"listing {remote.url}") from None
    return sorted(names)


def delete(s3, remote: Remote, names: list[str]) -> None:
    from boto3.exceptions import Boto3Error  # noqa: PLC0415  # boto3 loads only when a remote is used
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415  # boto3 loads only when a remote is used

    if not names:
        return
    try:
        s3.delete_objects(
            Bucket=remote.bucket,
            Delete={"Objects": [{"Key": remote.key(n)} for n in names], "Quiet": True},
        )
    except (Boto3Error, BotoCoreError, ClientError) as exc:
        raise _explain(exc, f"deleting from {remote.url}") from None


def read_json(s3, remote: Remote, name: str) -> dict:
    """One small object (a manifest) parsed as JSON."""
    from boto3.exceptions import Boto3Error  # noqa: PLC0415  # boto3 loads only when a remote is used
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415  # boto3 loads only when a remote is used

    try:
        body = s3.get_object(Bucket=remote.bucket, Key=remote.key(name))["Body"].read()
    except (Boto3Error, BotoCoreError, ClientError) as exc:
        raise _explain(exc, f"reading {name} at {remote.url}") from None
    try:
        data = json.loads(body)
    except ValueError:
        raise RemoteError(f"{name} at {remote.url} is not JSON") from None
    if not isinstance(data, dict):
        raise RemoteError(f"{name} at {remote.url} is not a manifest")
    return data
