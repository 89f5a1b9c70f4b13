"""`loopstudy submit`: a study sent to a cluster's job server as a Ray Job that runs `loopstudy run`."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

from study.console import eprint
from study.errors import ConfigError
from study.run.auth import refusal, use_token_if_present
from study.store.files import object_store_env

AGENT_WAIT_S = 60.0  # how long a submission waits for the head's job agent of a cluster that just started


def submit_study(spec_path: str, *, address: str, storage: str | None, repo: Path,
                 extra_args: list[str] | None = None) -> str:
    """Send `loopstudy run SPEC --address auto` to the cluster's job server, the repo as working dir."""
    use_token_if_present()  # before Ray is imported: it reads RAY_AUTH_MODE then
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    rel = os.path.relpath(os.path.abspath(spec_path), repo)
    if rel.startswith(".."):
        raise ConfigError(f"{spec_path}: the spec must live inside the repository ({repo}) to travel with it")
    cmd = ["python", "-m", "study.cli", "run", rel, "--address", "auto"]
    if storage:
        cmd += ["--store", storage]
    cmd += extra_args or []
    try:
        client = JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, AuthenticationError) as e:
        raise ConfigError(refusal(f"the job server at {address}", e)) from None
    # the object store's endpoint and credentials as this machine has them (they show in the job's runtime env on
    # the dashboard: on a cluster with its own role, leave them unset here)
    env = object_store_env()
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            return client.submit_job(
                entrypoint=" ".join(shlex.quote(c) for c in cmd),
                runtime_env={"working_dir": str(repo), "env_vars": env,
                             "excludes": [".git", ".venv", "results", "*.parquet", "__pycache__", "docs"]},
            )
        except RuntimeError as e:  # a cluster just started: its head's job agent has not registered yet
            if "No available agent" not in str(e) or time.monotonic() > deadline:
                raise
            eprint(f"the job server at {address} has no job agent yet (a cluster just started): retrying")
            time.sleep(2)
