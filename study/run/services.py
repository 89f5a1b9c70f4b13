"""The outside services a study names, opened before anything starts: the trackers' clients and servers (MLflow,
W&B), with a short timeout. (The Optuna storage is opened by study.run.optuna_storage.prepare and the results
store by Store and the preflight's write probe, each answering a failure in one line the same way.) A failure is
one ConfigError line naming what to set or install; a password or key in a URI is never printed."""

from __future__ import annotations

import importlib.util
import os
import socket
import urllib.parse

from study.errors import ConfigError
from study.paths import redacted
from study.spec import Study

CONNECT_TIMEOUT_S = 5.0  # a server that does not answer in this long is not there (MLflow's client retries minutes)


def reachable(url: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when something listens at an http(s) URL's host and port, else why not (the OS's words)."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or type(e).__name__


def check_mlflow(uri: str, source: str) -> None:
    """An MLflow tracking URI: a server that answers (http), or an SQLite file whose folder exists."""
    scheme = uri.split(":", 1)[0].lower()
    if scheme in ("http", "https") and (why := reachable(uri)) is not None:
        raise ConfigError(f"{source}: tracking.mlflow {redacted(uri)}: no MLflow server answers within "
                          f"{CONNECT_TIMEOUT_S:g}s ({why}); start it (mlflow server --port PORT) or set "
                          "tracking.mlflow: true for an SQLite store beside the results")
    if scheme == "sqlite":
        path = uri.split(":///", 1)[-1]
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise ConfigError(f"{source}: tracking.mlflow {redacted(uri)}: the folder {folder} does not exist; "
                              "create it or give another sqlite:///PATH")


def check_trackers(study: Study) -> None:
    """Every tracker the spec turns on: its client installed here, its server or account within reach."""
    t, source = study.spec.tracking, study.source
    wanted = {"tensorboard": ("tensorboardX", t.tensorboard), "mlflow": ("mlflow", t.mlflow),
              "wandb": ("wandb", t.wandb)}
    for name, (module, on) in wanted.items():
        if on and importlib.util.find_spec(module) is None:
            raise ConfigError(f"{source}: tracking.{name} needs the {module} package on this machine: "
                              f"pip install 'loopstudy[tracking]' (or turn tracking.{name} off)")
    if isinstance(t.mlflow, str):
        check_mlflow(t.mlflow, source)
    if t.wandb == "online" and not os.environ.get("WANDB_API_KEY"):
        raise ConfigError(f"{source}: tracking.wandb: online needs a W&B account: set WANDB_API_KEY (or use "
                          "tracking.wandb: offline and `wandb sync` the runs later)")
