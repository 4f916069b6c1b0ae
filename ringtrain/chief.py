"""What rank 0 alone does during a run: the console, TensorBoard scalars and
checkpoints. On every other rank each call does nothing, so the training loop
calls them unconditionally and stays linear."""
from ringtrain.workloads import checkpoints
from ringtrain.workloads.snapshots import Snapshots
from ringtrain.workloads.console import Console


class Chief:
    def __init__(self, args, model, optimizer, is_chief, per_epoch, size):
        import tensorflow as tf
        self.args, self.is_chief, self.per_epoch, self.size = args, is_chief, per_epoch, size
        self.console = Console(enabled=is_chief)
        self.ckpt = checkpoints.Checkpoints(args.checkpoint_dir, model, optimizer, keep=args.keep_checkpoints)
        self.writer = tf.summary.create_file_writer(args.log_dir) if is_chief and args.log_dir else None
        self.model = model
        self.snapshots = Snapshots(args.snapshot_dir if is_chief else None, args.snapshot_every)
        self.samples_seen = 0.0

    def restore(self):
        """Rank 0's progress from --resume (others get it by broadcast)."""
        if self.is_chief and self.args.resume:
            return self.ckpt.restore(self.args.resume)
        return checkpoints.Progress()

    def log_step(self, step, total_steps, epoch, loss, samples, lr):
        """loss: the mean over every rank's `samples` since the last log line."""
        self.console.progress(step, total_steps, f"epoch {epoch + 1} step {step}/{total_steps} "
                              f"loss {loss:.4f} lr {lr:.3g}", samples)
        self._scalars(step, {"train/loss": loss, "train/learning_rate": lr})

    def checkpoint(self, step, epoch, done_in_epoch, final=False):
        """Every --checkpoint-every steps, and at the end."""
        if self.is_chief and self.args.checkpoint_dir and (final or step % self.args.checkpoint_every == 0):
            self.ckpt.save(checkpoints.Progress.at(step, epoch, done_in_epoch, self.per_epoch,
                                                   self.size, self.args.batch_size))

    def snapshot(self, step, global_samples):
        """--snapshot-every: the weights, for evaluating afterwards (every rank holds the same)."""
        self.samples_seen += float(global_samples)
        if self.snapshots.due(step):
            self.snapshots.take(step, self.samples_seen,
                                lambda: [(v.name, v.numpy()) for v in self.model.variables])

    def test_scalars(self, step, evaluation):
        if evaluation.samples:  # (a simulated model is not evaluated)
            self._scalars(step, {"test/accuracy": evaluation.accuracy, "test/loss": evaluation.loss})
        if self.writer:
            self.writer.flush()

    def _scalars(self, step, values):
        if self.writer:
            import tensorflow as tf
            with self.writer.as_default(step=step):
                for name, value in values.items():
                    tf.summary.scalar(name, value)
