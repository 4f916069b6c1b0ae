"""Synchronous data-parallel training over Horovod's ring-allreduce.

Reads top to bottom like Horovod's examples/tensorflow2 scripts; every line
that distribution adds is marked `# Horovod:`.
"""
import sys
import time

import numpy as np

from ringtrain import checkpoints, knobs
from workloads import models, pipeline
from workloads.optimizers import keras_optimizer
from workloads.sharding import steps_per_epoch
from workloads.summary import StepTimer, emit, measured_throughput
from workloads.tfenv import set_threads


def train(args, dataset):
    knobs.apply_before_init(args)  # fusion buffer, cycle time, timeline: read by hvd.init
    import horovod.tensorflow as hvd
    import tensorflow as tf

    # Horovod: initialise; rank, size and local rank come from whoever launched us.
    hvd.init()
    set_threads(args.threads)
    is_chief = hvd.rank() == 0  # gates logging, summaries and checkpoints
    log = say if is_chief else (lambda line: None)

    # Horovod: pin each rank to one GPU by local rank, where there are GPUs.
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    model = models.build(args.model, seed=args.seed, dropout=not args.no_dropout)
    optimizer = keras_optimizer(args.optimizer, args.lr)
    optimizer.build(model.trainable_variables)
    per_epoch = steps_per_epoch(len(dataset.train_labels), hvd.size(), args.batch_size)
    lr_at = knobs.learning_rate_schedule(args, hvd.size(), per_epoch)

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
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss_sum, tf.reduce_sum(weights)

    @tf.function
    def eval_step(images, labels):
        logits = model(images, False)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, tf.int32), labels), tf.float64))
        return correct, tf.reduce_sum(tf.cast(models.per_example_loss(logits, labels), tf.float64))

    ckpt = checkpoints.Checkpoints(args.checkpoint_dir, model, optimizer, keep=args.keep_checkpoints)
    progress = ckpt.restore(args.resume) if is_chief and args.resume else checkpoints.Progress()
    # Horovod: every rank starts from rank 0's weights, optimizer state and progress.
    hvd.broadcast_variables(list(model.variables) + list(optimizer.variables), root_rank=0)
    progress = hvd.broadcast_object(progress, root_rank=0)

    step, epoch = progress.step, progress.epoch
    done_in_epoch = progress.batches_done(hvd.size(), args.batch_size)
    total_steps = args.steps or step + (args.epochs - epoch) * per_epoch - done_in_epoch
    writer = tf.summary.create_file_writer(args.log_dir) if is_chief and args.log_dir else None
    log(f"ringtrain: {args.model} on {dataset.source} ({len(dataset.train_labels)} train, "
        f"{len(dataset.test_labels)} test), {hvd.size()} rank(s) x batch {args.batch_size}, "
        f"{per_epoch} steps/epoch, steps {step}..{total_steps}")

    timer, losses, wall_start = StepTimer(), LossWindow(), time.perf_counter()
    while step < total_steps:
        for images, labels, weights, count in pipeline.train_batches(
                dataset, hvd.rank(), hvd.size(), args.batch_size, args.seed, epoch, done_in_epoch,
                args.threads):
            optimizer.learning_rate.assign(lr_at(step))
            loss_sum, samples = train_step(images, labels, weights, count)
            step, done_in_epoch = step + 1, done_in_epoch + 1
            timer.step_done(float(samples))
            losses.add(loss_sum, samples)
            if step % args.log_every == 0 or step == total_steps:
                # Horovod: the logged loss is the mean over every rank's samples.
                mean_loss = losses.global_mean(hvd)
                log(f"epoch {epoch + 1} step {step}/{total_steps} loss {mean_loss:.4f} "
                    f"lr {lr_at(step - 1):.3g}")
                if writer:
                    with writer.as_default(step=step):
                        tf.summary.scalar("train/loss", mean_loss)
                        tf.summary.scalar("train/learning_rate", lr_at(step - 1))
            if is_chief and args.checkpoint_dir and step % args.checkpoint_every == 0:
                ckpt.save(checkpoints.Progress.at(step, epoch, done_in_epoch, per_epoch,
                                                  hvd.size(), args.batch_size))
            if step >= total_steps:
                break
        if done_in_epoch >= per_epoch:
            epoch, done_in_epoch = epoch + 1, 0
    wall_seconds = time.perf_counter() - wall_start
    train_loss = losses.global_mean(hvd)

    # Horovod: a true global accuracy sums correct and total counts over ranks.
    totals = np.zeros(3)
    for images, labels in pipeline.eval_batches(dataset, hvd.rank(), hvd.size(), 256, args.threads):
        correct, loss_sum = eval_step(images, labels)
        totals += [float(correct), float(loss_sum), len(labels)]
    correct, test_loss_sum, seen = hvd.allreduce(tf.constant(totals), op=hvd.Sum).numpy()
    # Horovod: gather every rank's own timing; the global rate is measured, never rank 0 x N.
    reports = hvd.allgather_object(timer.report())

    if is_chief:
        if args.checkpoint_dir:
            ckpt.save(checkpoints.Progress.at(step, epoch, done_in_epoch, per_epoch,
                                              hvd.size(), args.batch_size))
        if writer:
            with writer.as_default(step=step):
                tf.summary.scalar("test/accuracy", correct / seen)
                tf.summary.scalar("test/loss", test_loss_sum / seen)
            writer.flush()
        emit({"mode": "ring", "model": args.model, "dataset": args.dataset,
              "data_source": dataset.source, "world_size": hvd.size(),
              "controller": "mpi" if hvd.mpi_enabled() else "gloo",
              "steps": step, "epochs": step / per_epoch, "train_loss": train_loss,
              "test_accuracy": correct / seen, "test_loss": test_loss_sum / seen,
              "test_samples": int(seen), "wall_time_sec": wall_seconds,
              "checkpoint": ckpt.latest, **measured_throughput(reports),
              "config": dict(sorted(vars(args).items()))}, args.summary_json)
    if args.dump_weights:
        np.savez(args.dump_weights.format(rank=hvd.rank()),
                 *[v.numpy() for v in model.variables])
    return 0


def say(line):
    # One write per line: launchers that prefix ranks' output split partial writes.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class LossWindow:
    """This rank's weighted-loss sum and sample count since the last global mean."""

    def __init__(self):
        self.loss_sum, self.count, self.last = 0.0, 0.0, float("nan")

    def add(self, loss_sum, count):
        self.loss_sum += float(loss_sum)
        self.count += float(count)

    def global_mean(self, hvd):
        import tensorflow as tf
        # Horovod: one small allreduce per log line, not one per step.
        total, count = hvd.allreduce(tf.constant([self.loss_sum, self.count], tf.float64),
                                     op=hvd.Sum).numpy()
        if count > 0:
            self.last = float(total / count)
        self.loss_sum = self.count = 0.0
        return self.last
