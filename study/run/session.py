"""Ray start-up for a driver: embedded local Ray by default, or a running cluster via --address; quiet unless
verbose (results live in Parquet, not in Tune's experiment folder)."""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlparse

from study.errors import ConfigError
from study.run.auth import refusal, use_token_if_present
from study.run.preflight import is_loopback
from study.store.files import object_store_env


def init_ray(address: str | None, num_cpus: int | None = None, verbose: bool = False) -> None:
    """Embedded local Ray (default) or join a cluster. A loopback address keeps this driver on 127.0.0.1 too.
    Quiet unless verbose: the terminal shows loopstudy's own lines (results live in Parquet, not in Tune's
    experiment folder), not Ray's token notice, Tune's configuration box or its "View detailed results" line."""
    if not verbose:
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's box and result-folder lines
        logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
        # a failed trial's traceback (Tune logs it whole) and Tune's closing warnings: the progress line says
        # why a trial failed in one line and where its traceback is (study.run.progress)
        for name in ("ray.tune", "ray.train"):  # ray.train: the syncer's tracebacks when the store refuses a write
            logging.getLogger(name).setLevel(logging.CRITICAL)
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # "Creating initial MLflow database tables..."
    # Frequent small checkpoints are by design (resume after a lost node); Tune's sync warning is noise here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Our rows go to the Parquet store. Tune's default CSV/JSON/TensorBoard loggers would only duplicate them, and
    # tensorboardX imports torch into the driver (which crashed job drivers here with an MKL load error).
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    embedded = is_embedded(address)
    if not embedded:
        use_token_if_present()  # before Ray is imported: it reads RAY_AUTH_MODE then
    if embedded or is_loopback(urlparse(f"//{address}").hostname or ""):
        # Ray otherwise swaps 127.0.0.1 for the machine's outward IP and looks for a raylet there; this keeps the
        # driver (and an embedded cluster) on loopback. Read by ray_constants at import, so set before importing.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    skip_callback_usage_tag()
    if embedded:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=verbose,
                 configure_logging=verbose)
    else:
        # the trials on the cluster reach the object store with this machine's endpoint and credentials, as a
        # submitted job's do (a job's own driver, at "auto", runs in that job's runtime env already)
        env = object_store_env() if address != "auto" else {}
        try:
            ray.init(address=address, runtime_env={"env_vars": env} if env else None, log_to_driver=verbose,
                     configure_logging=verbose)
        except (ConnectionError, RuntimeError, ray.exceptions.AuthenticationError) as e:
            raise ConfigError(refusal(f"could not join the Ray cluster at {address}", e)) from None


def is_embedded(address: str | None) -> bool:
    """Whether init_ray(address) starts a Ray inside this driver, rather than joining a cluster."""
    return address in (None, "", "local")


def skip_callback_usage_tag() -> None:
    """With Ray's usage stats off, keep Tune from importing every logger integration at each fit.

    Ray 2.60's tune.run tags the callback classes a run passes (ray.air._internal.usage.tag_callbacks) by importing
    the MLflow, W&B, Comet and Aim integrations to compare names: with mlflow and wandb installed that is ~1.5 CPU
    seconds at the start of every driver, for a tag only usage stats report. Private API, hence ray's exact pin in
    pyproject.toml."""
    from ray._common.usage.usage_lib import usage_stats_enabled
    from ray.air._internal import usage

    if not usage_stats_enabled():
        usage.tag_callbacks = lambda callbacks: False


def cluster_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]
