"""A search's sample that a driver's interruption cut short continues where it stopped.

The Optuna study gets the interrupted sample's parameters again (study.run.optuna_storage.prepare enqueues them),
so the next Tune trial of the search runs the same trial; Tune knows nothing of the earlier Tune trial's
checkpoints, so that trial looks for them itself: the newest checkpoint, holding a trainer state, that a trial of
the same experiment with the same searched parameters left (`carried_checkpoint`). It then continues from it as a
grid trial continues from its own on resume. Only the trials of interrupted samples look (the driver hands their
picks to every trial as `continues`): the others start fresh without reading the experiment's folders.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from study.paths import is_uri
from study.run.restore import CHECKPOINT_PREFIX, CKPT_FILE
from study.store.layout import tune_dir

PARAMS_FILE = "params.json"  # Tune's copy of a trial's config in its trial folder


def _filesystem(location: str):
    import pyarrow.fs as pafs

    if is_uri(location):
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), location


def carried_checkpoint(root: str, study: str, searched: dict[str, Any]):
    """The newest checkpoint (a ray.tune.Checkpoint) that an earlier Tune trial of the study's experiment left for
    these searched parameters, or None."""
    import pyarrow.fs as pafs
    from ray.tune import Checkpoint

    fs, experiment = _filesystem(tune_dir(root, study))
    newest = None
    for folder in fs.get_file_info(pafs.FileSelector(experiment, allow_not_found=True)):
        if folder.type != pafs.FileType.Directory:
            continue
        try:
            with fs.open_input_stream(posixpath.join(folder.path, PARAMS_FILE)) as f:
                config = json.loads(f.read())
        except (OSError, ValueError):
            continue
        if not isinstance(config, dict) or config.get("searched") != searched:
            continue
        for ckpt in fs.get_file_info(pafs.FileSelector(folder.path, allow_not_found=True)):
            state = fs.get_file_info(posixpath.join(ckpt.path, CKPT_FILE))
            if ckpt.base_name.startswith(CHECKPOINT_PREFIX) and state.type == pafs.FileType.File and (
                    newest is None or state.mtime_ns > newest[0]):
                newest = (state.mtime_ns, ckpt.path)
    return None if newest is None else Checkpoint(newest[1], filesystem=fs)
