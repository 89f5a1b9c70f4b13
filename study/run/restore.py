"""A trial restored from a checkpoint that exists: Tune's saved experiment can name a checkpoint that
CheckpointConfig(num_to_keep) has deleted since (the driver died after the deletion, before its next save), and Tune
then fails the trial for good ("Could not recover from checkpoint as it does not exist on storage anymore"). The
trial continues from the newest checkpoint of its own that holds a trainer state, or starts again when none does.

Attached to the Tune trial functions as `__mixins__`, the hook ray 2.60's wrap_function gives a function trainable
(pinned in pyproject.toml): Trainable.restore(checkpoint_result) is where Tune hands the trial its checkpoint.
"""

from __future__ import annotations

import copy
import posixpath

from study.console import eprint

CHECKPOINT_PREFIX = "checkpoint_"  # Tune's name for a trial's checkpoint folders (checkpoint_000012)
CKPT_FILE = "trainer.pt"  # the trainer's state in each of a trial's checkpoints (study.run.trainable writes it)


def newest_checkpoint(fs, path: str, state_file: str) -> str | None:
    """The checkpoint Tune named at `path` if it exists, else the newest sibling checkpoint folder that holds
    `state_file` (Tune numbers them in order), else None. fs: a pyarrow filesystem."""
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        return path
    infos = fs.get_file_info(pafs.FileSelector(posixpath.dirname(path), allow_not_found=True))
    folders = sorted((i.path for i in infos if i.type == pafs.FileType.Directory
                      and i.base_name.startswith(CHECKPOINT_PREFIX)), reverse=True)
    for folder in folders:
        if fs.get_file_info(posixpath.join(folder, state_file)).type == pafs.FileType.File:
            return folder
    return None


class RestoreFromExistingCheckpoint:
    """Mixin for a function trainable: restore from the newest checkpoint that exists (see the module docstring)."""

    def restore(self, checkpoint_result):
        from ray.tune import Checkpoint

        named = checkpoint_result.checkpoint
        found = newest_checkpoint(named.filesystem, named.path, CKPT_FILE)
        if found == named.path:
            return super().restore(checkpoint_result)
        if found is None:
            eprint(f"[{self.trial_name}] its checkpoint {named.path} is gone and no other is kept: starting again")
            return None
        eprint(f"[{self.trial_name}] its checkpoint {named.path} is gone: continuing from {found}")
        result = copy.copy(checkpoint_result)
        result.checkpoint = Checkpoint(found, filesystem=named.filesystem)
        return super().restore(result)
