"""Standard tf.train.Checkpoint files, written by one process: ring rank 0, or towers.

Atomic: TF writes a checkpoint's data and index files before
CheckpointManager rewrites the `checkpoint` state file (write-then-rename),
so a crash mid-save leaves the previous checkpoint as the latest one. Older
checkpoints are kept up to `keep`.

Progress is stored as (step, epoch, samples into the epoch), so that a
resume on a different rank count continues at the same point of the data.
"""
import glob
import os
import re
import shutil
import sys
from dataclasses import dataclass

from ringtrain.workloads.errors import TrainingStopped, UsageError, first_line


@dataclass
class Progress:
    step: int = 0               # optimizer updates done
    epoch: int = 0              # current epoch
    samples_in_epoch: int = 0   # global samples of `epoch` already trained on

    @classmethod
    def at(cls, step, epoch, batches_done, per_epoch, size, batch_size):
        if batches_done >= per_epoch:
            return cls(step, epoch + 1, 0)
        return cls(step, epoch, batches_done * size * batch_size)

    def batches_done(self, size, batch_size):
        """Batches of the current epoch to skip at `size` ranks."""
        return round(self.samples_in_epoch / (size * batch_size))


class Checkpoints:
    def __init__(self, directory, model, optimizer, keep=3):
        import tensorflow as tf
        self._tf = tf
        self._progress = {k: tf.Variable(0, dtype=tf.int64, trainable=False)
                          for k in ("step", "epoch", "samples_in_epoch")}
        self._ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, **self._progress)
        self.directory = directory
        self._manager = (tf.train.CheckpointManager(self._ckpt, directory, max_to_keep=keep)
                         if directory else None)

    @property
    def latest(self):
        return self._manager.latest_checkpoint if self._manager else None

    def save(self, progress):
        """Write a checkpoint; if the disk is full or failing, remove what the
        attempt left (TF's `ckpt-N_temp` folder), keep the older checkpoints,
        and stop the run in one line that says what to resume from."""
        for key, var in self._progress.items():
            var.assign(getattr(progress, key))
        try:
            return self._manager.save(checkpoint_number=progress.step)
        except (OSError, self._tf.errors.OpError) as e:
            raise failed_save(self.directory, f"ckpt-{progress.step}", progress.step, e, self.latest) from None

    def restore(self, source):
        """source: 'latest' (the newest in the checkpoint dir, or a fresh start
        if there is none yet), a checkpoint directory, or a checkpoint prefix."""
        path = self._resolve(source)
        if path is None:
            return Progress()
        # A named prefix is that checkpoint only; from a folder, an unreadable newest
        # one (cut short by a crash, say) falls back to the newest that reads.
        candidates = [path] + (self._older_than(path) if source == "latest" or os.path.isdir(source) else [])
        first_error = None
        for candidate in candidates:
            status = None
            try:
                status = self._ckpt.restore(candidate)
                status.assert_existing_objects_matched()
            except Exception as e:  # noqa: BLE001 -- a truncated file raises IndexError, among others
                if status is not None:
                    status.expect_partial()
                # TF warns at exit about the values a failed restore left; we say it in one line.
                self._tf.get_logger().setLevel("ERROR")
                first_error = first_error or e
                continue
            if candidate != path:
                sys.stderr.write(f"warning: checkpoint {path} is unreadable ({error_reason(first_error)}); "
                                 f"resumed from {candidate}, the newest that reads\n")
            return Progress(**{k: int(v.numpy()) for k, v in self._progress.items()})
        raise UsageError(f"cannot restore checkpoint {path}: {error_reason(first_error)}")

    def _older_than(self, path):
        """The checkpoints in path's folder older than it, newest first."""
        state = self._tf.train.get_checkpoint_state(os.path.dirname(path))
        paths = list(state.all_model_checkpoint_paths) if state else []
        paths = [p if os.path.isabs(p) else os.path.join(os.path.dirname(path), p) for p in paths]
        return [p for p in reversed(paths) if p != path and os.path.exists(p + ".index")]

    def _resolve(self, source):
        tf = self._tf
        if source == "latest":
            return self.latest
        if os.path.isdir(source):
            path = tf.train.latest_checkpoint(source)
            if path is None:
                raise UsageError(f"--resume {source}: no checkpoint in that directory")
            return path
        if not os.path.exists(source + ".index"):
            raise UsageError(f"--resume {source}: no such checkpoint (expected {source}.index)")
        return source


def failed_save(directory, name, step, error, latest, resume="resume with --resume"):
    """A save of checkpoint `name` into `directory` failed (disk full, I/O
    error): remove what the attempt left (TF's `NAME_temp*` folder and files),
    and return the one-line TrainingStopped that says what to resume from."""
    prefix = os.path.join(directory, name)
    for leftover in glob.glob(prefix + "_temp*") + glob.glob(prefix + ".*"):
        shutil.rmtree(leftover, ignore_errors=True) if os.path.isdir(leftover) else os.remove(leftover)
    return TrainingStopped(
        f"cannot write the checkpoint of step {step} to {directory}: {error_reason(error)}; "
        + (f"the last good checkpoint is {latest}: free space and {resume}" if latest
           else "no earlier checkpoint: free space and start again"))


def error_reason(error):
    """TF's message without its op plumbing ({{function_node ...}}, [Op:...])."""
    for cause in ("No space left on device", "Read-only file system", "Permission denied"):
        if cause in str(error):  # (graph mode puts it lines below "Graph execution error:")
            return cause[0].lower() + cause[1:]
    return re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\]", "", first_line(error))
