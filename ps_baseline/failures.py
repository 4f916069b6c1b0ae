"""How a v1 PS worker stops in one line instead of a traceback, without
spoiling the checkpoints: a non-finite loss, and a checkpoint that cannot be
written (a full disk, an I/O error); and how the chief gets past a newest
checkpoint that does not read.

MonitoredTrainingSession saves a checkpoint in a hook after every step that
is due one, and again when the session closes. An error raised from a hook
that runs before the saver's, or from the session's block, skips both: the
last checkpoint on disk stays the last good one.
"""
import contextlib
import glob
import math
import os
import re

from ringtrain.workloads.checkpoints import error_reason, failed_save
from ringtrain.workloads.errors import TrainingStopped, UsageError

RESUME = "restart the cluster with the same --checkpoint-dir"


def non_finite_loss_hook(tf, ops, task, checkpoint_dir):
    """A SessionRunHook that stops at a non-finite loss. On the chief it must
    run before the checkpoint saver (MonitoredTrainingSession's
    chief_only_hooks come first)."""

    class NonFiniteLoss(tf.compat.v1.train.SessionRunHook):
        def before_run(self, run_context):
            return tf.compat.v1.train.SessionRunArgs([ops.loss_sum, ops.count_my_step, ops.applied_step])

        def after_run(self, run_context, run_values):
            loss_sum, step, global_step = run_values.results
            if math.isfinite(float(loss_sum)):
                return
            latest = tf.train.latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
            resume = (f"the last good checkpoint is {latest}: {RESUME} and a lower --lr" if latest
                      else "no checkpoint was written yet (--checkpoint-dir)")
            raise TrainingStopped(f"non-finite loss at step {step} of worker {task} (global step {global_step}); "
                                  f"training stopped, {resume}")

    return NonFiniteLoss()


@contextlib.contextmanager
def checkpoint_failures(tf, checkpoint_dir):
    """Turn the chief's failed checkpoint save into one line (what it left removed)."""
    try:
        yield
    except (OSError, tf.errors.OpError) as e:
        temps = glob.glob(os.path.join(checkpoint_dir, "model.ckpt-*_temp*")) if checkpoint_dir else []
        if temps:
            step = re.search(r"model\.ckpt-(\d+)_temp", temps[0]).group(1)
            raise failed_save(checkpoint_dir, f"model.ckpt-{step}", step, e,
                              tf.train.latest_checkpoint(checkpoint_dir), resume=RESUME) from None
        if checkpoint_dir and "No space left on device" in str(e):
            # (the graph or summaries, written into the same folder: what they left goes too)
            for leftover in glob.glob(os.path.join(checkpoint_dir, "*.tmp*")):
                os.remove(leftover)
            raise TrainingStopped(f"cannot write to {checkpoint_dir} (--checkpoint-dir): no space left on device; "
                                  "free space, then " + RESUME) from None
        raise


def newest_readable_checkpoint(tf, checkpoint_dir, log):
    """The chief, before MonitoredTrainingSession restores the folder's newest
    checkpoint: if that one does not read (cut short by a crash, say), say so
    and point the folder's `checkpoint` state at the newest that does (the
    broken files stay, for a look). Returns the one it will restore, or None."""
    state = tf.train.get_checkpoint_state(checkpoint_dir) if checkpoint_dir else None
    if not state:
        return None
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    broken = []
    for i in range(len(paths) - 1, -1, -1):
        try:
            reader = tf.train.load_checkpoint(paths[i])
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)  # a truncated data file fails only here
        except Exception as e:  # noqa: BLE001 -- TF raises several kinds for a broken file
            broken.append((paths[i], e))
            continue
        if broken:
            log(f"warning: checkpoint {broken[0][0]} is unreadable ({error_reason(broken[0][1])}); "
                f"restoring {paths[i]}, the newest that reads")
            tf.compat.v1.train.update_checkpoint_state(checkpoint_dir, paths[i],
                                                       all_model_checkpoint_paths=paths[:i + 1])
        return paths[i]
    raise UsageError(f"no checkpoint in {checkpoint_dir} reads (the newest, {broken[0][0]}: "
                     f"{error_reason(broken[0][1])}): move the folder aside to start afresh")
