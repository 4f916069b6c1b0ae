"""Synchronous data-parallel training over Horovod's ring-allreduce.

Reads top to bottom like Horovod's examples/tensorflow2 scripts; every line
that distribution adds is marked `# Horovod:`.
"""
import os
import time

import numpy as np

from ringtrain import checkpoints, knobs
from workloads import data, models, pipeline
from workloads.sharding import steps_per_epoch
from workloads.summary import emit, measured_throughput
from workloads.tfenv import set_threads

WARMUP_STEPS_EXCLUDED = 3  # tracing and first allreduce negotiations are not throughput


def train(args):
    knobs.apply_before_init(args)  # fusion buffer, cycle time, timeline: read by hvd.init
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    # Horovod: initialise; rank, size and local rank come from whoever launched us.
    hvd.init()
    set_threads(args.threads)
    is_chief = hvd.rank() == 0  # gates logging, summaries and checkpoints

    # Horovod: pin each rank to one GPU by local rank, where there are GPUs.
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    model_options = {"dropout": False} if args.no_dropout and args.model == "mnist_cnn" else {}
    model = models.build(args.model, seed=args.seed, **model_options)
    dataset = data.load(args.dataset, args.data_dir, model.image_shape, args.seed)
    check_shapes(dataset, model, args)
    optimizer = make_optimizer(args.optimizer, args.lr, keras)
    optimizer.build(model.trainable_variables)
    per_epoch = steps_per_epoch(len(dataset.train_labels), hvd.size(), args.batch_size)
    total_steps = args.steps or per_epoch * args.epochs
    lr_at = knobs.learning_rate_schedule(args, hvd.size(), per_epoch)

    # Horovod: sum or Adasum-combine gradients; the loss below is normalised so
    # that Average gives the exact gradient of the whole global batch.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    reduce_op = hvd.Adasum if args.adasum else hvd.Average

    @tf.function
    def train_step(images, labels, weights, global_count):
        with tf.GradientTape() as tape:
            loss_sum = tf.reduce_sum(weights * models.per_example_loss(model(images, True), labels))
            # Horovod: divide by the global batch's mean per-rank share, not the local count.
            loss = loss_sum / (global_count / hvd.size())
        # Horovod: each gradient's allreduce starts as soon as backprop produces it.
        tape = hvd.DistributedGradientTape(tape, compression=compression, op=reduce_op)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss_sum, tf.reduce_sum(weights)

    @tf.function
    def eval_step(images, labels):
        logits = model(images, False)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, tf.int32), labels), tf.float32))
        return correct, tf.reduce_sum(models.per_example_loss(logits, labels))

    ckpt = checkpoints.Checkpoints(args.checkpoint_dir, model, optimizer, keep=args.keep_checkpoints)
    progress = ckpt.restore(args.resume) if is_chief and args.resume else checkpoints.Progress()
    # Horovod: every rank starts from rank 0's weights, optimizer state and progress.
    hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
    progress = hvd.broadcast_object(progress, root_rank=0)

    writer = tf.summary.create_file_writer(args.log_dir) if is_chief and args.log_dir else None
    log = print if is_chief else (lambda *a, **k: None)
    log(f"ringtrain: {args.model} on {dataset.source} ({len(dataset.train_labels)} train, "
        f"{len(dataset.test_labels)} test), {hvd.size()} rank(s) x batch {args.batch_size}, "
        f"{per_epoch} steps/epoch, {total_steps} steps", flush=True)

    step, window = progress.step, LossWindow()
    timed_samples, timed_start, wall_start = 0.0, None, time.perf_counter()
    while step < total_steps:
        epoch = step // per_epoch
        skip = progress.skip_batches(per_epoch, hvd.size(), args.batch_size) if step == progress.step else 0
        for images, labels, weights, count in pipeline.train_batches(
                dataset, hvd.rank(), hvd.size(), args.batch_size, args.seed, epoch, skip):
            optimizer.learning_rate.assign(lr_at(step))
            loss_sum, n = train_step(images, labels, weights, count)
            step += 1
            window.add(loss_sum, n)
            if step == progress.step + WARMUP_STEPS_EXCLUDED:
                timed_start, timed_samples = time.perf_counter(), 0.0
            elif timed_start is not None:
                timed_samples += float(n)
            if step % args.log_every == 0 or step == total_steps:
                # Horovod: metrics are averaged over all ranks' samples, not rank 0's.
                mean_loss = window.global_mean(hvd)
                log(f"epoch {epoch + 1} step {step}/{total_steps} loss {mean_loss:.4f} "
                    f"lr {lr_at(step - 1):.5g}", flush=True)
                if writer:
                    with writer.as_default(step=step):
                        tf.summary.scalar("train/loss", mean_loss)
                        tf.summary.scalar("train/learning_rate", lr_at(step - 1))
            if is_chief and args.checkpoint_every and step % args.checkpoint_every == 0:
                ckpt.save(checkpoints.Progress.at(step, per_epoch, hvd.size(), args.batch_size))
            if step >= total_steps:
                break
    timed_seconds = time.perf_counter() - timed_start if timed_start else 0.0
    wall_seconds = time.perf_counter() - wall_start

    # Horovod: a true global accuracy sums correct and total counts over ranks.
    correct = loss_sum_test = seen = 0.0
    for images, labels in pipeline.eval_batches(dataset, hvd.rank(), hvd.size(), 256):
        c, l = eval_step(images, labels)
        correct, loss_sum_test, seen = correct + float(c), loss_sum_test + float(l), seen + len(labels)
    correct, loss_sum_test, seen = hvd.allreduce(
        tf.constant([correct, loss_sum_test, seen], tf.float64), op=hvd.Sum).numpy()
    # Horovod: every rank's own timing, gathered; the global rate is measured, never rank 0 x N.
    timings = hvd.allgather(tf.constant([[timed_samples, timed_seconds]], tf.float64)).numpy()
    train_loss = window.global_mean(hvd)

    if is_chief:
        if args.checkpoint_dir:
            ckpt.save(checkpoints.Progress.at(step, per_epoch, hvd.size(), args.batch_size))
        if writer:
            with writer.as_default(step=step):
                tf.summary.scalar("test/accuracy", correct / seen)
                tf.summary.scalar("test/loss", loss_sum_test / seen)
            writer.flush()
        summary = {
            "mode": "ring", "model": args.model, "dataset": args.dataset,
            "data_source": dataset.source, "world_size": hvd.size(),
            "steps": step, "epochs": step / per_epoch, "train_loss": train_loss,
            "test_accuracy": correct / seen, "test_loss": loss_sum_test / seen,
            "test_samples": int(seen), "wall_time_sec": wall_seconds,
            "controller": "mpi" if hvd.mpi_enabled() else "gloo",
            "checkpoint": ckpt.latest if args.checkpoint_dir else None,
            **measured_throughput(timings[:, 0].tolist(), timings[:, 1].tolist()),
            "config": {k: v for k, v in sorted(vars(args).items()) if k != "func"},
        }
        emit(summary, args.summary_json)
    if args.dump_weights:
        np.savez(args.dump_weights.format(rank=hvd.rank()),
                 **{f"v{i}": v.numpy() for i, v in enumerate(model.variables)})
    return 0


def make_optimizer(name, lr, keras):
    if name == "sgd":
        return keras.optimizers.SGD(lr)
    if name == "momentum":
        return keras.optimizers.SGD(lr, momentum=0.9)
    return keras.optimizers.Adam(lr)


def check_shapes(dataset, model, args):
    from workloads.errors import UsageError
    if tuple(dataset.train_images.shape[1:]) != tuple(model.image_shape):
        raise UsageError(f"model {args.model} takes {model.image_shape} images, dataset "
                         f"{args.dataset} has {dataset.train_images.shape[1:]}: pick a matching pair")


class LossWindow:
    """Local weighted-loss sum and sample count since the last global mean."""

    def __init__(self):
        self.loss_sum, self.count, self.last = 0.0, 0.0, float("nan")

    def add(self, loss_sum, count):
        self.loss_sum += float(loss_sum)
        self.count += float(count)

    def global_mean(self, hvd):
        import tensorflow as tf
        # Horovod: one small allreduce per log line, not per step.
        total = hvd.allreduce(tf.constant([self.loss_sum, self.count], tf.float64),
                              op=hvd.Sum).numpy()
        if total[1] > 0:
            self.last = float(total[0] / total[1])
        self.loss_sum = self.count = 0.0
        return self.last
