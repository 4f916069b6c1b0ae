"""Synchronous data-parallel training over Horovod's ring-allreduce.

Reads top to bottom like Horovod's examples/tensorflow2 scripts; every line
that distribution adds is marked `# Horovod:`. What rank 0 alone does (the
console, TensorBoard, checkpoints) is in ringtrain/chief.py.
"""
import time

import numpy as np

from ringtrain import knobs
from ringtrain.chief import Chief
from ringtrain.stall import StallWatchdog
from ringtrain.workloads import models, pipeline
from ringtrain.workloads.errors import TrainingStopped
from ringtrain.workloads.evaluation import Evaluation, evaluate
from ringtrain.workloads.horovod_env import allreduce_algorithm_in_effect, horovod_loop_in_effect
from ringtrain.workloads.optimizers import keras_optimizer
from ringtrain.workloads.outputs import parent_made
from ringtrain.workloads.sharding import steps_per_epoch
from ringtrain.workloads.straggler import Slowdown, summary_fields
from ringtrain.workloads.straggler import check as check_straggler
from ringtrain.workloads.summary import StepTimer, build_summary
from ringtrain.workloads.tfenv import set_threads


def train(args, dataset):
    knobs.apply_before_init(args)  # MPI yield, fusion buffer, cycle time, timeline: read by hvd.init
    import horovod.tensorflow as hvd

    # Horovod: initialise; rank, size and local rank come from whoever launched us.
    hvd.init()
    check_straggler(args.straggler, hvd.size())
    set_threads(args.threads)
    # Horovod: pin each rank to one GPU by local rank, where there are GPUs.
    pin_gpu(hvd.local_rank())

    model, optimizer = build(args)
    per_epoch = steps_per_epoch(len(dataset.train_labels), hvd.size(), args.batch_size)
    # Horovod: the lr grows with the rank count, after a warm-up.
    lr_at = knobs.learning_rate_schedule(args, hvd.size(), per_epoch)
    train_step = make_train_step(args, hvd, model, optimizer)
    chief = Chief(args, model, optimizer, hvd.rank() == 0, per_epoch, hvd.size())

    # Horovod: every rank starts from rank 0's weights, optimizer state and progress.
    progress = hvd.broadcast_object(chief.restore(), root_rank=0)
    hvd.broadcast_variables(list(model.variables) + list(optimizer.variables), root_rank=0)

    # Out-of-band: a frozen rank is named and the job ended, not waited on forever.
    watchdog = StallWatchdog(hvd, args.stall_timeout)
    step, skip = progress.step, progress.batches_done(hvd.size(), args.batch_size)
    total_steps = args.steps or progress.step + (args.epochs - progress.epoch) * per_epoch - skip
    chief.console.begin(f"ringtrain: {args.model} on {dataset.source} ({len(dataset.train_labels)} train, "
                        f"{len(dataset.test_labels)} test), {hvd.size()} rank(s) x batch {args.batch_size}, "
                        f"{per_epoch} steps/epoch, steps {step}..{total_steps}")
    # Horovod: each rank reads its own disjoint shard of every epoch.
    batches = pipeline.batches_from(dataset, hvd.rank(), hvd.size(), args.batch_size, args.seed,
                                    progress.epoch, skip, args.threads)
    if watchdog.describe():
        chief.console.line(watchdog.describe())
    watchdog.start()
    timer, losses, wall_start = StepTimer(args.warmup_steps), LossWindow(), time.perf_counter()
    slowdown = Slowdown(args.straggler, hvd.rank())
    chief.snapshots.start_clock()
    epoch = done_in_epoch = None
    skipped = 0
    for step, (epoch, done_in_epoch, batch) in zip(range(step + 1, total_steps + 1), batches):
        optimizer.learning_rate.assign(lr_at(step - 1))
        with slowdown.step(step):  # --straggler: that rank waits after its compute
            loss_sum, samples, finite = train_step(*batch)
        if not finite:
            skipped += non_finite_step(args, hvd, chief, step, loss_sum)
        timer.step_done(float(samples))
        watchdog.step_done(step)
        losses.add(loss_sum, samples)
        if step % args.log_every == 0 or step == total_steps:
            # Horovod: the logged loss is the mean over every rank's samples.
            chief.log_step(step, total_steps, epoch, *losses.global_mean(hvd), lr_at(step - 1))
        chief.checkpoint(step, epoch, done_in_epoch)
        chief.snapshot(step, global_samples=batch[3])
    wall_seconds = time.perf_counter() - wall_start
    watchdog.stop()

    evaluation = Evaluation() if models.is_simulated(model) else global_evaluation(hvd, model, dataset)
    # Horovod: every rank's own timing; the global rate is measured, never rank 0 x N.
    reports = hvd.allgather_object(dict(timer.report(), straggler_wait_sec=slowdown.waited))
    if epoch is not None:
        chief.checkpoint(step, epoch, done_in_epoch, final=True)
    chief.test_scalars(step, evaluation)
    controller = "mpi" if hvd.mpi_enabled() else "gloo"
    summary = build_summary(
        "ring", args, dataset, world_size=hvd.size(), steps=step, epochs=step / per_epoch,
        train_loss=losses.last, evaluation=evaluation, wall_seconds=wall_seconds, reports=reports,
        controller=controller, hosts=[r["host"] for r in reports], checkpoint=chief.ckpt.latest,
        allreduce_algorithm=allreduce_algorithm_in_effect(controller), horovod_loop=horovod_loop_in_effect(),
        skipped_steps=skipped, **summary_fields(args.straggler, [r["straggler_wait_sec"] for r in reports]),
        gradient_bytes=sum(v.shape.num_elements() * v.dtype.size for v in model.trainable_variables))
    chief.console.finish(summary, args.summary_json)
    if args.dump_weights:
        np.savez(parent_made(args.dump_weights.format(rank=hvd.rank())), *[v.numpy() for v in model.variables])
    return 0


def build(args):
    """The model and its optimizer, its slots created."""
    model = models.build(args.model, seed=args.seed, dropout=not args.no_dropout,
                         simulate_gpu_ms=args.simulate_gpu)
    optimizer = keras_optimizer(args.optimizer, args.lr)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def make_train_step(args, hvd, model, optimizer):
    import tensorflow as tf
    # Horovod: fp16 compression and Adasum are options; Average is the default.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    reduce_op = hvd.Adasum if args.adasum else hvd.Average

    @tf.function
    def train_step(images, labels, weights, global_count):
        with tf.GradientTape() as tape:
            loss_sum = tf.reduce_sum(weights * models.per_example_loss(model(images, True), labels))
            # Horovod: divide by the global batch's mean per-rank share, not the local
            # count, so that averaging over ranks gives exactly the global batch's gradient.
            loss = loss_sum / (global_count / hvd.size())
        if not args.no_allreduce:
            # Horovod: each gradient's allreduce starts as soon as backprop produces it.
            tape = hvd.DistributedGradientTape(tape, compression=compression, op=reduce_op)
        grads = tape.gradient(loss, model.trainable_variables)
        # A non-finite gradient never reaches the weights. After the allreduce
        # every rank holds the same gradients, so every rank decides alike.
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])

        def apply():
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))
        return loss_sum, tf.reduce_sum(weights), finite

    return train_step


def non_finite_step(args, hvd, chief, step, loss_sum):
    """A step whose gradients were not finite (its update was not applied):
    with --on-nan skip, say so and go on (returns 1, a skipped step); else stop
    every rank, rank 0 saying in one line where and what to resume from."""
    if args.on_nan == "skip":
        chief.console.line(f"step {step}: non-finite gradients; update skipped (--on-nan skip)")
        return 1
    mine = bool(np.isfinite(float(loss_sum)))
    # Horovod: every rank reached this step with the same gradients; name the ranks whose loss broke.
    finite = [mine] if args.no_allreduce else hvd.allgather_object(mine)
    ranks = [r for r, ok in enumerate(finite) if not ok] or "every rank (loss finite, gradients not)"
    latest = chief.ckpt.latest if chief.is_chief else None
    resume = (f"the last good checkpoint is {latest}: resume with --resume and a lower --lr"
              if latest else "no checkpoint was written yet (--checkpoint-dir)")
    raise TrainingStopped(f"non-finite loss at step {step} on rank(s) {ranks}; training stopped before "
                          f"applying it, {resume}, or pass --on-nan skip",
                          quiet=not chief.is_chief and not args.no_allreduce)


def global_evaluation(hvd, model, dataset):
    """Each rank evaluates its share of the test split; the counts are summed."""
    import tensorflow as tf
    metrics = tf.function(lambda images, labels: models.correct_and_loss_sum(model(images, False), labels),
                          reduce_retracing=True)
    mine = evaluate(metrics, dataset, hvd.rank(), hvd.size())
    # Horovod: a true global accuracy sums correct and total counts over ranks.
    total = hvd.allreduce(tf.constant([mine.correct, mine.loss_sum, mine.samples], tf.float64),
                          op=hvd.Sum).numpy()
    return Evaluation(float(total[0]), float(total[1]), int(total[2]))


def pin_gpu(local_rank):
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.experimental.set_memory_growth(gpus[local_rank], True)
        tf.config.set_visible_devices(gpus[local_rank], "GPU")


class LossWindow:
    """This rank's weighted-loss sum and sample count since the last global mean."""

    def __init__(self):
        self.loss_sum, self.count, self.last = 0.0, 0.0, None

    def add(self, loss_sum, count):
        self.loss_sum += float(loss_sum)
        self.count += float(count)

    def global_mean(self, hvd):
        """(mean loss over every rank's samples since the last call, those samples)."""
        import tensorflow as tf
        # Horovod: one small allreduce per log line, not one per step.
        total, count = hvd.allreduce(tf.constant([self.loss_sum, self.count], tf.float64),
                                     op=hvd.Sum).numpy()
        if count > 0:
            self.last = float(total / count)
        self.loss_sum = self.count = 0.0
        return self.last, float(count)
