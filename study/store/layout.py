"""Where everything lives under a results root: the one statement of the store's path layout.

    <root>/<table>/study=<name>/<trial_id>.parquet        a trial's rows of one table
    <root>/<table>/study=<name>/study.compacted.parquet   a study's compacted trials (loopstudy compact)
    <root>/_studies/<name>.yaml                           the spec a study was last run with
    <root>/_compacting/<name>.json                        per-trial files a running compaction is removing
    <root>/_tune/<name>/                                  Ray Tune's experiment state (checkpoints, resume)
    <root>/_tune/_evaluate/<name>/                        the same for `loopstudy evaluate` of the study
    <root>/_tune/_train/<name>/<trial_id>/                Ray Train's run of a trial on several workers (checkpoints)
    <root>/_leases/<name>.json                            the driver running the study (store/lease.py)
    <root>/_optuna/<name>.journal                         an Optuna search's study (optuna_storage.py)
    <root>/_tracking/<name>/                              MLflow's and W&B's local runs (tracking.py)
    <root>/_weights/<name>/<trial_id>/final.safetensors   a trial's final (EMA) weights (study/trial/weights.py)
    <root>/_weights/<name>/<trial_id>/step-<N>.safetensors   weights kept at training step N

Folders starting with '_' and files starting with '.' (writes in flight) are never read as table rows. No table
file starts with '_' or '.': plain Parquet readers (pyarrow.dataset, pandas) skip such files, and a table read
with DuckDB, pandas, pyarrow or Polars at `<root>/<table>` must hold the same rows as loopstudy's read.
"""

from __future__ import annotations

import re

from study.paths import join

TRIAL_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\.parquet")  # <trial_id>.parquet: what a trial writes
COMPACTED = "study.compacted.parquet"  # never a trial file's name (TRIAL_FILE has no inner '.')
LEGACY_COMPACTED = "_compacted.parquet"  # earlier stores' name (plain readers skip it): read; the next compaction
COMPACTED_NAMES = (COMPACTED, LEGACY_COMPACTED)  # replaces it
STUDY_DIR_PREFIX = "study="


def table_dir(root: str, table: str, study: str) -> str:
    return f"{root}/{table}/{STUDY_DIR_PREFIX}{study}"


def trial_file(root: str, table: str, study: str, trial_id: str) -> str:
    return f"{table_dir(root, table, study)}/{trial_id}.parquet"


def compacted_file(root: str, table: str, study: str, name: str = COMPACTED) -> str:
    return f"{table_dir(root, table, study)}/{name}"


def file_trial_id(path: str) -> str:
    """The trial id a trial file is named for: `.../<trial_id>.parquet` -> `<trial_id>`."""
    return path.rsplit("/", 1)[-1].removesuffix(".parquet")


def study_of_dir(name: str) -> str | None:
    """`study=<name>` -> `<name>`; None for a folder that is not a study partition."""
    return name[len(STUDY_DIR_PREFIX):] if name.startswith(STUDY_DIR_PREFIX) else None


def spec_file(study: str) -> str:
    """The saved spec of a study, relative to the root."""
    return f"_studies/{study}.yaml"


def compacting_marker(study: str) -> str:
    """A running compaction's list of doomed per-trial files, relative to the root."""
    return f"_compacting/{study}.json"


def write_probe(token: str) -> str:
    """A file a command writes and removes to learn that the root can be written (a dot-file: never read)."""
    return f".write-check-{token}"


def figures_dir(uri: str) -> str:
    """Where a study's figures and report go by default: `<root>/figures` beside the tables (for an object store,
    `results/figures` on this machine: matplotlib writes local files)."""
    return "results/figures" if "://" in uri else f"{uri.rstrip('/')}/figures"


def tune_dir(root: str, study: str | None = None) -> str:
    """Where Tune keeps experiment state (of one study): beside the tables, ignored by readers. A URI keeps its
    query (endpoint, scheme, region) at the end."""
    return join(root, "_tune", *([study] if study else []))


def evaluate_tune_dir(root: str) -> str:
    """Where Tune keeps the experiments of `loopstudy evaluate` (one per study, apart from the study's own run, which
    `loopstudy resume` restores); no study name starts with '_'."""
    return join(root, "_tune", "_evaluate")


def train_runs_dir(root: str, study: str) -> str:
    """Where Ray Train keeps the runs of a study's trials that train on several workers (resources.workers), one
    run per trial id: its checkpoints, from which a restarted worker group or a retried trial resumes."""
    return join(root, "_tune", "_train", study)


def optuna_journal(root: str, study: str) -> str:
    """An Optuna search's default storage: a JournalStorage file beside the tables (study/run/optuna_storage.py)."""
    return f"{root.rstrip('/')}/_optuna/{study}.journal"


def tracking_dir(root: str, study: str) -> str | None:
    """Where a study's local tracking files go (MLflow's SQLite store, W&B's offline runs): `<root>/_tracking/
    <study>` for a local root; None for an object store (the tracker's files then stay on this machine)."""
    return None if "://" in root else f"{root.rstrip('/')}/_tracking/{study}"


def weights_file(study: str, trial_id: str, step: int | None = None) -> str:
    """A trial's stored weights, relative to the root: the final ones, or those kept at training step `step`."""
    return f"_weights/{study}/{trial_id}/{'final' if step is None else f'step-{step:08d}'}.safetensors"
