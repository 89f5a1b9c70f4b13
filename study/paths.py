"""Paths and files: what a location string is (an object-store URI such as s3://bucket/prefix, or a
path on this machine), this machine's cache folder, and atomic writes, the one way loopstudy writes a file that
others may read at the same moment.

Atomic writes: on a file system the content goes to a temporary dot-file beside the target, which is renamed into
place: a reader sees the old file or the new one, never half of one, and a crash leaves at most a dot-file that
every listing passes over. On an object store the write is a single PUT, visible only when complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs

from study.errors import StoreError


def is_uri(location: str) -> bool:
    """Whether `location` names an object store (scheme://...) rather than a local or NFS path."""
    return "://" in location


SERVED_SCHEMES = ("s3", "file")  # besides local and NFS paths: S3 (AWS or any S3-compatible server) and file://
SECRET_PARAMS = ("access_key", "secret_key", "session_token")  # pyarrow's URI spellings of credentials


def redacted(uri: str) -> str:
    """A URI as it may be printed: a password in its user part and credential query parameters as ***."""
    parts = urllib.parse.urlsplit(uri)
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if parts.password is None and not any(k in SECRET_PARAMS for k, _ in pairs):
        return uri
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    query = "&".join(f"{k}=***" if k in SECRET_PARAMS else f"{k}={v}" for k, v in pairs)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def normalized_uri(uri: str) -> str:
    """An object-store URI as pyarrow, Polars and Tune read it: an endpoint written with its scheme, as
    AWS_ENDPOINT_URL users write it (`?endpoint_override=http://HOST:PORT`), becomes `endpoint_override=HOST:PORT
    &scheme=http`. StoreError for a URI loopstudy cannot serve (another scheme, an S3 URI without a bucket), at
    once rather than after a client has waited for credentials that are not there."""
    scheme = uri.split("://", 1)[0].lower()
    if scheme not in SERVED_SCHEMES:
        raise StoreError(f"results store {redacted(uri)}: {scheme}:// is not served; use a local or NFS path, or "
                         "s3://BUCKET/PREFIX (AWS, or any S3-compatible server such as MinIO, SeaweedFS or GCS's S3 "
                         "endpoint, named with ?endpoint_override=HOST:PORT or AWS_ENDPOINT_URL)")
    base, _, query = uri.partition("?")
    if scheme == "s3" and not urllib.parse.urlsplit(base).hostname:
        raise StoreError(f"results store {redacted(uri)}: no bucket; give s3://BUCKET or s3://BUCKET/PREFIX")
    params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    endpoint = params.get("endpoint_override", "")
    if "://" not in endpoint:
        return uri
    given, _, host = endpoint.partition("://")
    if params.get("scheme", given) != given:
        raise StoreError(f"results store {redacted(uri)}: endpoint_override says {given}:// and scheme says "
                         f"{params['scheme']}; give one")
    params.update(endpoint_override=host.rstrip("/"), scheme=given)
    return f"{base}?{urllib.parse.urlencode(params, safe=':/')}"


def join(location: str, *parts: str) -> str:
    """`location/part/...` for a path or a URI: a URI's query (`?endpoint_override=...&scheme=http`) stays at the
    end, where pyarrow and Tune read it (appended after it, a path part would become part of the query)."""
    base, sep, query = location.partition("?") if is_uri(location) else (location, "", "")
    return "/".join([base.rstrip("/"), *parts]) + sep + query


def machine_cache() -> Path:
    """This machine's own loopstudy files (datasets, and an object-store study's Optuna journal and tracking runs):
    $LOOPSTUDY_CACHE, else ~/.cache/loopstudy; the temporary folder when HOME is missing or not a folder (a
    cluster's service account, a container), so nothing fails for want of a home."""
    if os.environ.get("LOOPSTUDY_CACHE"):
        return Path(os.environ["LOOPSTUDY_CACHE"])
    try:
        home = Path.home()
    except (RuntimeError, KeyError):
        home = None
    base = home / ".cache" if home is not None and home.is_dir() else Path(tempfile.gettempdir())
    return base / "loopstudy"


def resolve_root(root: str | os.PathLike) -> str:
    """A results root as every command and trial sees it: an object-store URI normalized (normalized_uri), a path
    made absolute (trials run in other working folders)."""
    root = str(root)
    return normalized_uri(root) if is_uri(root) else os.path.abspath(root)


@contextlib.contextmanager
def atomic_target(final: str, fs: pafs.FileSystem | None = None) -> Iterator[str]:
    """Yield the path to write `final`'s content to; on leaving the block it becomes `final` (or, after an error,
    is removed). fs: a pyarrow file system (default: this machine's)."""
    fs = fs or pafs.LocalFileSystem()
    folder, name = final.rsplit("/", 1) if "/" in final else (".", final)
    fs.create_dir(folder, recursive=True)
    if not isinstance(fs, pafs.LocalFileSystem) and not _is_local_subtree(fs):
        yield final  # object store: one PUT
        return
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        yield tmp
        fs.move(tmp, final)
    finally:
        if fs.get_file_info(tmp).type != pafs.FileType.NotFound:
            fs.delete_file(tmp)


def _is_local_subtree(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.SubTreeFileSystem) and isinstance(fs.base_fs, pafs.LocalFileSystem)


def write_bytes(final: str, data: bytes, fs: pafs.FileSystem | None = None) -> None:
    """`data` as the whole content of `final`, atomically."""
    fs = fs or pafs.LocalFileSystem()
    with atomic_target(final, fs) as tmp, fs.open_output_stream(tmp) as out:
        out.write(data)


def local_copy(location: str, *siblings: str) -> str:
    """A path on this machine holding the file `location` names: the path itself, or for an object-store URI a copy
    in this machine's cache (machine_cache()/fetched/, one folder per object version: URI, size and modification
    time), fetched once, with the `siblings` of its folder that exist copied beside it. StoreError (one line) when
    the object is not there."""
    if not is_uri(location):
        return location
    uri = normalized_uri(location)
    fs, key = pafs.FileSystem.from_uri(uri)
    info = fs.get_file_info(key)
    if info.type != pafs.FileType.File:
        raise StoreError(f"{redacted(location)}: no such object")
    tag = hashlib.sha256(f"{redacted(uri)}|{info.size}|{info.mtime_ns}".encode()).hexdigest()[:16]
    name = key.rsplit("/", 1)[-1]
    folder = machine_cache() / "fetched" / tag
    target = folder / name
    if not target.is_file():
        parent = key.rsplit("/", 1)[0]
        local = pafs.LocalFileSystem()
        # the siblings first: the named file's presence says the folder is complete
        for source, dest in [*((f"{parent}/{s}", s) for s in siblings), (key, name)]:
            if fs.get_file_info(source).type == pafs.FileType.File:
                with atomic_target(str(folder / dest)) as tmp:
                    pafs.copy_files(source, tmp, source_filesystem=fs, destination_filesystem=local)
    return str(target)
