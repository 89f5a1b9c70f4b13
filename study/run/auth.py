"""Ray's token authentication as a loopstudy client meets it (Ray 2.60: `RAY_AUTH_MODE=token` on every node and
client; the token in `RAY_AUTH_TOKEN`, the file `RAY_AUTH_TOKEN_PATH` names, or `~/.ray/auth_token`).

Every cluster this project ships or starts runs with it (cluster/local_cluster.py, aws-gpu.yaml, the RayJob). A
Ray 2.60 client joining a cluster does not turn it on by itself, so a client that has a token turns the mode on
(`use_token_if_present`): a cluster without authentication ignores the token. A client the cluster refuses is told in
one line what is missing (`refusal`)."""

from __future__ import annotations

import os
from pathlib import Path

MODE = "RAY_AUTH_MODE"
TOKEN, TOKEN_PATH = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
HOW = (f"give it as {TOKEN}, as the file {TOKEN_PATH} names, or in ~/.ray/auth_token (`ray get-auth-token` on the "
       "head prints it; cluster/local_cluster.py prints where it wrote it)")


def default_token_file() -> Path:
    return Path.home() / ".ray" / "auth_token"


def token_source() -> str | None:
    """Where this machine's Ray token is (None: nowhere Ray looks)."""
    if os.environ.get(TOKEN, "").strip():
        return TOKEN
    path = os.environ.get(TOKEN_PATH)
    if path:
        return f"{TOKEN_PATH} ({path})" if _has_text(Path(path)) else None
    return str(default_token_file()) if _has_text(default_token_file()) else None


def _has_text(path: Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except (OSError, UnicodeDecodeError):
        return False


def use_token_if_present() -> None:
    """Turn token mode on for this client when it has a token and RAY_AUTH_MODE is unset (before Ray is imported
    or initialised: Ray reads the mode then). An explicit RAY_AUTH_MODE is left as it is."""
    if MODE not in os.environ and token_source() is not None:
        os.environ[MODE] = "token"


def refusal(what: str, error: BaseException) -> str:
    """The one line for a cluster (or its job server, `what`) that this client could not join: what is missing
    when the cause may be Ray's token, else what Ray said."""
    said = (str(error).strip().splitlines() or [type(error).__name__])[0]
    auth_said = any(w in said.lower() for w in ("authentication", "unauthenticated", "401", "403"))
    source = token_source()
    if os.environ.get(MODE, "").lower() == "disabled":
        return (f"{what}: {said} (RAY_AUTH_MODE=disabled here; a cluster with Ray's token authentication, the "
                f"default of the clusters loopstudy ships, refuses such a client: unset it and {HOW})")
    if source is None and auth_said:
        return f"{what}: it asks for Ray's auth token, and this machine has none: {HOW}"
    if source is None:
        return (f"{what}: {said} (nothing answers there, or it asks for Ray's auth token and this machine has none: "
                f"{HOW})")
    if auth_said:
        return f"{what} refused the Ray auth token from {source}: it is not this cluster's token; {HOW}"
    return f"{what}: {said} (nothing answers there, or it refused the Ray auth token from {source})"
