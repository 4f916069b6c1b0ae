"""Checkpoints, one policy for every mode: when to save, what --resume
restores, falling back past a newest checkpoint that does not read, and a
full disk. Written by one process, the chief.

Two stores write the files, because a run's variables live in one of two
worlds: `ObjectStore` (tf.train.Checkpoint: ring, towers, TF2 PS, TF's
collective mode) and `GraphStore` (tf.compat.v1 Saver: the graph-mode PS of
the classic distributed-TensorFlow tutorials). Both keep TF's `checkpoint`
state file, written after a complete save (write-then-rename), so a crash
mid-save leaves the previous checkpoint as the latest one.

Progress is stored as (step, epoch, samples into the epoch), so that a
resume on a different rank count continues at the same point of the data.
"""
import glob
import os
import re
import shutil
import sys
from dataclasses import dataclass

from ringtrain.common.errors import TrainingStopped, UsageError, first_line

RESUME = "resume with --resume"
# The run a checkpoint folder belongs to: a scheduler's job, which a requeue starts again with the
# same ID. A run that finds its own checkpoints there resumes from them without being asked.
RUN_FILE = "ringtrain-run"
RUN_ID_ENVS = ("RINGTRAIN_RUN_ID", "SLURM_JOB_ID")


def run_id():
    """This run's ID, where a scheduler gives one (a requeued SLURM job keeps its ID), else None."""
    return next((os.environ[name] for name in RUN_ID_ENVS if os.environ.get(name)), None)


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
    """The policy. `store` writes and reads one checkpoint; `directory` None: no checkpoints."""

    def __init__(self, directory, store, every=100, resume=None):
        self.directory, self.store, self.every, self.resume_from = directory, store, every, resume
        self._last_due = self._last_saved = self._resumed = None

    @property
    def latest(self):
        import tensorflow as tf
        return tf.train.latest_checkpoint(self.directory) if self.directory else None

    @property
    def last_good(self):
        """The newest checkpoint known to read: this run's last save, else the one it
        resumed from (the folder's state may still name an unreadable newer one)."""
        if self._last_saved:
            return self._last_saved[1]
        return self._resumed or self.latest

    def resume(self):
        """What --resume asks for, restored: its Progress (None where the store
        keeps the position in the graph), or None for a fresh start. Without
        --resume, a folder that already holds checkpoints is refused: a run
        must neither overwrite nor silently continue someone's training."""
        source = self.resume_from
        if not source and self.latest and self._own_run():
            source = "latest"
            sys.stderr.write(f"{self.directory} holds this run's own checkpoints (run {run_id()}, started again by "
                             f"its scheduler): resuming from the newest\n")
            sys.stderr.flush()
        if not source:
            if self.latest:
                raise UsageError(f"--checkpoint-dir {self.directory} already holds checkpoints (the newest is "
                                 f"{self.latest}): pass --resume to continue from it, or give an empty folder")
            return None
        path = self._resolve(source)
        if path is None:
            return None
        # A named prefix is that checkpoint only; from a folder, an unreadable newest
        # one (cut short by a crash, say) falls back to the newest that reads.
        candidates = [path] + (self._older_than(path) if source == "latest" or os.path.isdir(source) else [])
        first_error = None
        for candidate in candidates:
            try:
                progress = self.store.restore(candidate)
            except Exception as e:  # noqa: BLE001 -- a truncated file raises IndexError, among others
                first_error = first_error or e
                continue
            if candidate != path:
                sys.stderr.write(f"warning: checkpoint {path} is unreadable ({error_reason(first_error)}); "
                                 f"resumed from {candidate}, the newest that reads\n")
                sys.stderr.flush()
            self._resumed = candidate
            return progress
        raise UsageError(f"cannot restore checkpoint {path}: {error_reason(first_error)}")

    def _own_run(self):
        try:
            with open(os.path.join(self.directory, RUN_FILE)) as f:
                return run_id() is not None and f.read().strip() == run_id()
        except OSError:
            return False

    def due(self, step):
        """Whether a checkpoint is due after `step`: a multiple of --checkpoint-every
        was reached since the last one (PS steps can jump by several updates)."""
        if not self.directory:
            return False
        if self._last_due is None:
            self._last_due = step - 1
        due = step // self.every > self._last_due // self.every
        if due:
            self._last_due = step
        return due

    def save(self, number, progress=None):
        """Write checkpoint `number`; if the disk is full or failing, remove
        what the attempt left (TF's `NAME_temp*` folder), keep the older
        checkpoints, and stop the run in one line that says what to resume from."""
        if not self.directory:
            return None
        if self._last_saved and self._last_saved[0] == number:
            return self._last_saved[1]  # (the final checkpoint, when the last step was saved already)
        try:
            self._last_saved = (number, self.store.save(self.directory, number, progress))
            if run_id() and not self._own_run():
                with open(os.path.join(self.directory, RUN_FILE), "w") as f:
                    f.write(run_id() + "\n")
            return self._last_saved[1]
        except Exception as e:  # noqa: BLE001 -- OSError, or TF's OpError for the same
            if not _is_write_failure(e):
                raise
            prefix = os.path.join(self.directory, self.store.name(number))
            for leftover in glob.glob(prefix + "_temp*") + glob.glob(prefix + ".*"):
                shutil.rmtree(leftover, ignore_errors=True) if os.path.isdir(leftover) else os.remove(leftover)
            latest = self.last_good
            raise TrainingStopped(
                f"cannot write the checkpoint of step {number} to {self.directory}: {error_reason(e)}; "
                + (f"the last good checkpoint is {latest}: free space and {RESUME}" if latest
                   else "no earlier checkpoint: free space and start again")) from None

    def _older_than(self, path):
        """The checkpoints in path's folder older than it, newest first."""
        import tensorflow as tf
        state = tf.train.get_checkpoint_state(os.path.dirname(path))
        paths = list(state.all_model_checkpoint_paths) if state else []
        paths = [p if os.path.isabs(p) else os.path.join(os.path.dirname(path), p) for p in paths]
        return [p for p in reversed(paths) if p != path and os.path.exists(p + ".index")]

    def _resolve(self, source):
        import tensorflow as tf
        if source == "latest":
            return self.latest
        if os.path.isdir(source):
            path = tf.train.latest_checkpoint(source)
            if path is None:
                raise UsageError(f"--resume {source}: no checkpoint in that directory")
            return path
        check_resume_path(source)
        return source


def check_resume_path(source):
    """--resume CKPT names a checkpoint folder or a checkpoint's prefix (PREFIX.index
    is there): one line where it names neither. Needs no TensorFlow: the flags'
    checks call it before TF loads."""
    if source in (None, "latest") or os.path.isdir(source):
        return
    if not os.path.exists(source + ".index"):
        raise UsageError(f"--resume {source}: no such checkpoint (expected {source}.index)")


class ObjectStore:
    """tf.train.Checkpoint of named objects (model, optimizer, counters), with
    the run's Progress beside them; files ckpt-N."""

    def __init__(self, keep=3, **objects):
        import tensorflow as tf
        self._tf = tf
        self._progress = {k: tf.Variable(0, dtype=tf.int64, trainable=False)
                          for k in ("step", "epoch", "samples_in_epoch")}
        self._ckpt = tf.train.Checkpoint(**objects, **self._progress)
        self._keep, self._managers = keep, {}

    @staticmethod
    def name(number):
        return f"ckpt-{number}"

    def save(self, directory, number, progress):
        for key, var in self._progress.items():
            var.assign(getattr(progress or Progress(number), key))
        if directory not in self._managers:
            self._managers[directory] = self._tf.train.CheckpointManager(self._ckpt, directory,
                                                                         max_to_keep=self._keep)
        return self._managers[directory].save(checkpoint_number=number)

    def restore(self, path):
        status = None
        try:
            status = self._ckpt.restore(path)
            status.assert_existing_objects_matched()
        except Exception:
            if status is not None:
                status.expect_partial()
            # TF warns at exit about the values a failed restore left; we say it in one line.
            self._tf.get_logger().setLevel("ERROR")
            raise
        return Progress(**{k: int(v.numpy()) for k, v in self._progress.items()})


class GraphStore:
    """A tf.compat.v1 Saver over the graph's global variables (the model, the
    optimizer's slots, the global step and each worker's own step count):
    files model.ckpt-N, as MonitoredTrainingSession writes them. Restoring
    happens as the chief's session is made (`session_creator`), so restore()
    only checks that the checkpoint reads in full and fits the graph, and
    remembers it. The position lives in the graph's own step counters."""

    def __init__(self, tf, keep, run_in_session):
        """run_in_session(f): f(a tf.Session) run in the mode's training session."""
        self._tf, self.run_in_session = tf, run_in_session
        self.saver = tf.compat.v1.train.Saver(max_to_keep=keep, sharded=True)
        self.restore_path = None

    @staticmethod
    def name(number):
        return f"model.ckpt-{number}"

    def save(self, directory, number, progress):
        os.makedirs(directory, exist_ok=True)  # (checked at start-up)
        prefix = os.path.join(directory, "model.ckpt")
        # (no .meta graph: the graph is rebuilt to restore, and its constants hold the initial weights)
        return self.run_in_session(lambda sess: self.saver.save(sess, prefix, global_step=number,
                                                                write_meta_graph=False))

    def restore(self, path):
        tf = self._tf
        reader = tf.train.load_checkpoint(path)
        saved = reader.get_variable_to_shape_map()
        for name in saved:
            reader.get_tensor(name)  # a truncated data file fails only here
        wanted = {v.op.name for v in tf.compat.v1.global_variables()}
        missing = sorted(wanted - set(saved))
        if missing:
            raise UsageError(f"it lacks {len(missing)} of this graph's variables (e.g. {missing[0]}): "
                             "another model or mode wrote it")
        self.restore_path = path
        return None

    def session_creator(self, is_chief, master, config, max_wait_secs):
        tf = self._tf
        scaffold = tf.compat.v1.train.Scaffold(saver=self.saver)
        if is_chief:
            # The chief initialises the variables, or restores exactly what resume() chose.
            return tf.compat.v1.train.ChiefSessionCreator(scaffold, master, config,
                                                          checkpoint_filename_with_path=self.restore_path)
        return tf.compat.v1.train.WorkerSessionCreator(scaffold, master, config, max_wait_secs=max_wait_secs)


DISK_FAILURES = ("No space left on device", "Read-only file system", "Permission denied", "Input/output error",
                 "Disk quota exceeded")


def _is_write_failure(error):
    """A save that failed for the disk's sake (TF wraps the OS's errors in its
    own), not for a peer's: a PS task that is gone is the watchdog's to name."""
    return isinstance(error, OSError) or any(cause in str(error) for cause in DISK_FAILURES)


def error_reason(error):
    """TF's message without its op plumbing ({{function_node ...}}, [Op:...])."""
    if isinstance(error, UsageError):
        return str(error)
    for cause in DISK_FAILURES:
        if cause in str(error):  # (graph mode puts it lines below "Graph execution error:")
            return cause[0].lower() + cause[1:]
    return re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\]", "", first_line(error))
