"""The file system under a results root: pyarrow.fs for local, NFS and object-store roots, fast local listings,
atomic writes and small text files, and how Polars reaches the same files."""

from __future__ import annotations

import os
import sys
import urllib.parse
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from study.errors import StoreError
from study.paths import atomic_target, is_uri, normalized_uri, redacted, write_bytes

# What names an object store's endpoint, credentials and region in the environment (pyarrow, Polars and the AWS SDK
# read them): `loopstudy submit` and `loopstudy run --address` carry those that are set to the cluster, whose
# drivers and trials then reach the same store as this machine does.
OBJECT_STORE_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                    "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_EC2_METADATA_DISABLED")


def object_store_env() -> dict[str, str]:
    """The OBJECT_STORE_ENV variables set here, for a cluster's runtime env."""
    return {k: os.environ[k] for k in OBJECT_STORE_ENV if os.environ.get(k)}


def uri_query(uri: str) -> dict[str, str]:
    """An object-store URI's query: endpoint_override, scheme, region (pyarrow.fs's spelling)."""
    return dict(urllib.parse.parse_qsl(uri.partition("?")[2]))


def uri_endpoint(query: dict[str, str]) -> str | None:
    """The endpoint a URI's query names (`scheme://endpoint_override`), if it names one."""
    if "endpoint_override" not in query:
        return None
    return f"{query.get('scheme', 'https')}://{query['endpoint_override']}"


def endpoint(uri: str) -> str:
    """The S3 endpoint a URI reaches: its `endpoint_override`, else $AWS_ENDPOINT_URL(_S3), else AWS itself."""
    named = uri_endpoint(uri_query(uri))
    if named:
        return named
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(var):
            return f"{os.environ[var]} (${var})"
    return "AWS S3 itself (no endpoint_override in the URI, no $AWS_ENDPOINT_URL)"


def object_store_error(uri: str, e: OSError) -> str:
    """One line for an object store that cannot be used: unreachable, refusing the credentials, or without a
    region; what it said, and how to give the endpoint, credentials or region (never their values)."""
    said = " ".join(str(e).split())[:300]
    where = f"results store {uri} (endpoint {endpoint(uri)})"
    how_endpoint = ("name the server as s3://BUCKET/PREFIX?endpoint_override=HOST:PORT&scheme=http or with "
                    "AWS_ENDPOINT_URL=http://HOST:PORT")
    if any(k in said for k in ("ACCESS_DENIED", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403")):
        return (f"{where} refused the credentials: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the profile "
                f"or role this machine uses). It said: {said}")
    if "region must be set" in said:
        return f"{where}: no region; add &region=us-east-1 to the URI or set AWS_DEFAULT_REGION. It said: {said}"
    if any(k in said for k in ("NETWORK_CONNECTION", "curlCode", "resolve host", "Could not connect")):
        return f"cannot reach the {where}: {said}. Start the server, or {how_endpoint}"
    return f"{where}: {said}. If the endpoint is wrong, {how_endpoint}"


# Why a linked folder under a table is left out (listing.check_study refuses a command that names its study)
LINKED = ("a symbolic link: not followed (outside readers do not follow it either); move the folder into place, or "
          "link the whole results root instead")


@dataclass(frozen=True, slots=True)
class Entry:
    """A listed file or folder (the fields of pyarrow's FileInfo that the store uses)."""

    path: str
    base_name: str
    size: int | None
    mtime_ns: int | None
    is_file: bool


@dataclass
class Root:
    """A results root opened once per Store: its file system, its path there, and what this Store has said
    (each left-out file named once) and checked (footer verdicts per file version)."""

    uri: str
    fs: pafs.FileSystem
    root: str
    local: bool
    warned: set[str] = field(default_factory=set)
    verdicts: dict[tuple, str | None] = field(default_factory=dict)
    # per file version: its config columns that the installed config does not declare (an uninstalled plugin's)
    extras: dict[tuple, list] = field(default_factory=dict)

    @classmethod
    def open(cls, uri: str) -> Root:
        try:
            uri.encode("utf-8")
        except UnicodeEncodeError:
            raise StoreError(f"results store {uri.encode('utf-8', 'surrogateescape')!r} is not a UTF-8 path; "
                             "give a path or URI in UTF-8") from None
        if is_uri(uri):
            uri = normalized_uri(uri)
            try:
                fs, path = pafs.FileSystem.from_uri(uri)
            except (pa.ArrowException, ValueError) as e:
                raise StoreError(f"results store {redacted(uri)}: {e}") from None
            local = isinstance(fs, pafs.LocalFileSystem)
        else:
            fs, path, local = pafs.LocalFileSystem(), os.path.abspath(uri), True
        root = cls(uri, fs, path.rstrip("/"), local)
        try:
            kind = root.kind(root.root)
        except OSError as e:
            if local:
                raise
            raise StoreError(object_store_error(uri, e)) from None
        if kind == pafs.FileType.File:
            raise StoreError(f"results store {uri} is a file; give a folder (it is created if missing) or "
                             "an object-store URI such as s3://bucket/prefix")
        return root

    def kind(self, path: str) -> pafs.FileType:
        return self.fs.get_file_info(path).type

    def warn(self, path: str, why: str) -> None:
        """Name a file left out of a read, once per file and Store however many tables a command reads."""
        if path not in self.warned:
            self.warned.add(path)
            print(f"loopstudy: left out {path}: {why}", file=sys.stderr)

    def entries(self, base: str, recursive: bool) -> list[Entry]:
        """What lies under `base` (nothing when it is missing). A local folder is read with os.scandir, links not
        followed: only a regular file is a file (a symlink, FIFO or folder named like one is not), and at 10,000
        trial files it is several times faster than pyarrow's FileInfo listing."""
        if self.local:
            return self._local_entries(base, recursive)
        sel = pafs.FileSelector(base, recursive=recursive, allow_not_found=True)
        return [Entry(i.path, i.base_name, i.size, i.mtime_ns, i.type == pafs.FileType.File)
                for i in self.fs.get_file_info(sel)]

    def _local_entries(self, base: str, recursive: bool) -> list[Entry]:
        try:
            it = os.scandir(base)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        with it:
            for e in it:
                if e.name.startswith("."):  # writes in flight: renamed away at any moment, never read
                    continue
                if e.is_file(follow_symlinks=False):
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:  # removed since the listing (a compaction): not there
                        continue
                    out.append(Entry(e.path, e.name, st.st_size, st.st_mtime_ns, True))
                else:
                    out.append(Entry(e.path, e.name, None, None, False))
                    if recursive and e.is_dir(follow_symlinks=False):
                        out += self._local_entries(e.path, True)
                    elif recursive and e.is_symlink() and e.is_dir():
                        self.warn(e.path, LINKED)
        return out

    def write_table(self, data: pa.Table, final: str) -> None:
        """A Parquet file, atomically (see study.paths)."""
        with atomic_target(final, self.fs) as tmp:
            pq.write_table(data, tmp, filesystem=self.fs)

    def put_bytes(self, rel: str, data: bytes) -> None:
        """A file under the root, atomically (a reader sees it whole or not at all)."""
        write_bytes(f"{self.root}/{rel}", data, self.fs)

    def get_bytes(self, rel: str) -> bytes | None:
        """A file under the root; None when there is none."""
        path = f"{self.root}/{rel}"
        if self.kind(path) != pafs.FileType.File:
            return None
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read()
        except FileNotFoundError:  # never written, or removed meanwhile (a compaction's marker)
            return None

    def put_text(self, rel: str, text: str) -> None:
        """A small text file under the root (e.g. _studies/<name>.yaml), atomically."""
        self.put_bytes(rel, text.encode())

    def get_text(self, rel: str) -> str | None:
        data = self.get_bytes(rel)
        try:
            return None if data is None else data.decode()
        except UnicodeDecodeError:
            raise StoreError(f"{self.root}/{rel} is not UTF-8 text: it is damaged; remove or restore it") from None

    # -- the same files through Polars' reader --------------------------------------------------------------------
    def polars_path(self, path: str) -> str:
        return path if self.local else f"{self.uri.split('://', 1)[0]}://{path}"

    def polars_options(self) -> dict[str, str] | None:
        """storage_options for Polars' object-store reader, from the URI's query (endpoint_override, scheme,
        region: the pyarrow.fs spelling); credentials come from the environment as for pyarrow."""
        if self.local or "?" not in self.uri:
            return None
        query = uri_query(self.uri)
        opts = {}
        if uri_endpoint(query):
            opts["aws_endpoint_url"] = uri_endpoint(query)
            if query.get("scheme", "https") == "http":
                opts["aws_allow_http"] = "true"
        if "region" in query:
            opts["aws_region"] = query["region"]
        return opts or None
