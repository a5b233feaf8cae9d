"""Object storage behind one interface, chosen by ``STORAGE_URL``.

* ``file://./var/storage`` (relative to the current directory) or
  ``file:///abs/path`` -> :class:`FilesystemStorage` (the default);
* ``s3://BUCKET[?endpoint=http://HOST:PORT][&region=REGION]`` ->
  :class:`S3Storage` (endpoint defaults to ``https://s3.amazonaws.com``).

Callers use :class:`Storage` and the errors in :mod:`app.errors` only.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from app.errors import ConfigError

from .base import ObjectInfo, Storage, validate_key
from .filesystem import FilesystemStorage

__all__ = ["FilesystemStorage", "ObjectInfo", "S3Storage", "Storage", "storage_from_url", "validate_key"]


def storage_from_url(url: str, *, access_key: str = "", secret_key: str = "") -> Storage:
    """Build the backend ``url`` names; raise :class:`ConfigError` naming ``STORAGE_URL``.

    No I/O happens here: call :meth:`Storage.check` to find out whether the
    store is usable. Error messages never echo credentials.
    """
    url = url.strip()
    if url.startswith("file://"):
        return _filesystem(url[len("file://"):])
    if url.startswith("s3://"):
        return _s3(url, access_key, secret_key)
    raise ConfigError("STORAGE_URL must start with file:// or s3://")


def _filesystem(rest: str) -> FilesystemStorage:
    if not rest or "?" in rest or "#" in rest:
        raise ConfigError(f"STORAGE_URL=file://{rest} must be file://RELATIVE/PATH or file:///ABS/PATH")
    if rest.startswith("localhost/"):
        rest = rest[len("localhost"):]
    return FilesystemStorage(Path.cwd() / rest if not rest.startswith("/") else Path(rest))


def __getattr__(name: str):
    # the S3 backend and its client (minio, urllib3: 0.16 s of CPU to import) are loaded only where STORAGE_URL
    # names a bucket: a process on file storage never pays for them, in its first job or in memory
    if name == "S3Storage":
        from .s3 import S3Storage

        return S3Storage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _s3(url: str, access_key: str, secret_key: str) -> Storage:
    from .s3 import DEFAULT_ENDPOINT, S3Storage

    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise ConfigError("STORAGE_URL must not contain credentials; use S3_ACCESS_KEY/S3_SECRET_KEY")
    if parts.path not in ("", "/") or parts.fragment:
        raise ConfigError("STORAGE_URL must be s3://BUCKET?endpoint=URL&region=REGION (no path)")
    query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(query) - {"endpoint", "region"})
    if unknown:
        raise ConfigError(f"STORAGE_URL has unknown parameter(s): {', '.join(unknown)}")
    if any(len(values) != 1 for values in query.values()):
        raise ConfigError("STORAGE_URL repeats a parameter")
    endpoint = query.get("endpoint", [DEFAULT_ENDPOINT])[0] or DEFAULT_ENDPOINT
    region = query.get("region", [""])[0] or None
    try:
        return S3Storage(parts.netloc, endpoint=endpoint, access_key=access_key,
                         secret_key=secret_key, region=region)
    except ValueError as exc:
        raise ConfigError(f"STORAGE_URL is invalid: {exc}") from None
