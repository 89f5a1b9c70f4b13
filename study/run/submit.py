"""`loopstudy submit`: a study sent to a cluster's job server as a Ray Job that runs `loopstudy run`."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from study.errors import ConfigError
from study.store.files import object_store_env


def submit_study(spec_path: str, *, address: str, storage: str | None, repo: Path,
                 extra_args: list[str] | None = None) -> str:
    """Send `loopstudy run SPEC --address auto` to the cluster's job server, the repo as working dir."""
    from ray.job_submission import JobSubmissionClient

    rel = os.path.relpath(os.path.abspath(spec_path), repo)
    if rel.startswith(".."):
        raise ConfigError(f"{spec_path}: the spec must live inside the repository ({repo}) to travel with it")
    cmd = ["python", "-m", "study.cli", "run", rel, "--address", "auto"]
    if storage:
        cmd += ["--store", storage]
    cmd += extra_args or []
    client = JobSubmissionClient(address)
    # the object store's endpoint and credentials as this machine has them (they show in the job's runtime env on
    # the dashboard: on a cluster with its own role, leave them unset here)
    env = object_store_env()
    job_id = client.submit_job(
        entrypoint=" ".join(shlex.quote(c) for c in cmd),
        runtime_env={"working_dir": str(repo), "env_vars": env,
                     "excludes": [".git", ".venv", "results", "*.parquet", "__pycache__", "docs"]},
    )
    return job_id
