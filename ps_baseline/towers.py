"""`ps-baseline towers --towers K`: the seeds' single-machine multi-device
training (TF's cifar10_multi_gpu_train): one process, one tower of the model
per device, the towers' gradients averaged on the CPU and applied once.

The K devices are K GPUs where there are that many; otherwise the CPU is split
into K logical devices, so that the same code path runs on a CPU-only machine.
Lines that the towers add are marked `# Towers:`.
"""
import time

import numpy as np

from ringtrain.workloads.checkpoints import Checkpoints, Progress
from ringtrain.workloads.console import Console
from ringtrain.workloads.errors import UsageError
from ringtrain.workloads.flags import OneLineParser, add_training_flags, load_training_data, positive_int
from ringtrain.workloads.optimizers import keras_optimizer
from ringtrain.workloads.outputs import check_outputs, parent_made
from ringtrain.workloads.sharding import steps_per_epoch
from ringtrain.workloads.snapshots import Snapshots
from ringtrain.workloads.straggler import check as check_straggler
from ringtrain.workloads.straggler import summary_fields
from ringtrain.workloads.summary import StepTimer, build_summary
from ringtrain.workloads.tfenv import import_tensorflow_quietly

PROG = "ps-baseline towers"


def parser():
    p = OneLineParser(prog=PROG, description="One process, one tower per device (K GPUs, or the CPU split "
                      "into K logical devices): gradients averaged on the CPU, applied once per step.")
    p.add_argument("--towers", type=positive_int, default=2, metavar="K", help="towers (default %(default)s)")
    p.add_argument("--checkpoint-every", type=positive_int, default=100, metavar="K",
                   help="checkpoint every K steps and at the end (default %(default)s)")
    p.add_argument("--keep-checkpoints", type=positive_int, default=3, metavar="K")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir")
    p.add_argument("--dump-weights", metavar="FILE", help="save the final weights (.npz), as ringtrain does")
    add_training_flags(p)
    return p


def tower_devices(tf, k):
    """K GPUs if there are as many, else the CPU split into K logical devices.
    Must run before TF's runtime starts."""
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= k:
        return [f"/device:GPU:{i}" for i in range(k)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * k)
    return [d.name for d in tf.config.list_logical_devices("CPU")][:k]


def main(argv):
    args = parser().parse_args(argv)
    if args.resume and not args.checkpoint_dir:
        raise UsageError("--resume needs --checkpoint-dir DIR: the folder to resume from")
    check_outputs(args)
    dataset = load_training_data(args)  # numpy: bad input fails before TF loads
    tf = import_tensorflow_quietly()
    from ringtrain.workloads import models, pipeline  # (these import TF)
    from ringtrain.workloads.evaluation import Evaluation, evaluate
    k = args.towers
    check_straggler(args.straggler, k, "tower")
    if args.threads:
        # Towers: one pool thread per tower, so the towers compute side by side.
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads * k)
    devices = tower_devices(tf, k)
    console = Console()

    # Towers: the variables, the optimizer and the averaging live on the CPU.
    with tf.device("/device:CPU:0"):
        model = models.build(args.model, seed=args.seed, dropout=not args.no_dropout,
                             simulate_gpu_ms=args.simulate_gpu)
        optimizer = keras_optimizer(args.optimizer, args.lr)
        optimizer.build(model.trainable_variables)
    ckpt = Checkpoints(args.checkpoint_dir, model, optimizer, keep=args.keep_checkpoints)
    progress = ckpt.restore("latest") if args.resume else Progress()
    per_epoch = steps_per_epoch(len(dataset.train_labels), k, args.batch_size)
    step, skip = progress.step, progress.batches_done(k, args.batch_size)
    total_steps = args.steps or progress.step + (args.epochs - progress.epoch) * per_epoch - skip
    console.begin(f"{PROG}: {args.model} on {dataset.source}, {k} tower(s) on {', '.join(devices)} x batch "
                  f"{args.batch_size}, {per_epoch} steps/epoch, steps {step}..{total_steps}")
    # Towers: each tower reads its own disjoint shard of every epoch, as a worker would.
    towers = [pipeline.batches_from(dataset, i, k, args.batch_size, args.seed, progress.epoch, skip, args.threads)
              for i in range(k)]
    train_step = make_train_step(tf, model, optimizer, devices)
    timer, wall_start = StepTimer(args.warmup_steps), time.perf_counter()
    snapshots = Snapshots(args.snapshot_dir, args.snapshot_every)
    window_loss = window_count = seen = 0.0
    waited = np.zeros(k)  # each tower's --straggler waiting
    epoch = done = None
    for step, parts in zip(range(step + 1, total_steps + 1), zip(*towers)):
        epoch, done = parts[0][0], parts[0][1]
        # --straggler: how many times its compute each tower waits after it, this step
        extra = tf.constant([args.straggler.extra(i, step) if args.straggler else 0.0 for i in range(k)])
        loss_sum, samples, tower_waits = train_step([batch for _, _, batch in parts], extra)
        timer.step_done(float(samples))
        waited, seen = waited + tower_waits.numpy(), seen + float(samples)
        if snapshots.due(step):
            snapshots.take(step, seen, lambda: [(v.name, v.numpy()) for v in model.variables])
        window_loss, window_count = window_loss + float(loss_sum), window_count + float(samples)
        if step % args.log_every == 0 or step == total_steps:
            console.progress(step, total_steps, f"epoch {epoch + 1} step {step}/{total_steps} "
                             f"loss {window_loss / max(window_count, 1):.4f}", window_count)
            if step < total_steps:
                window_loss = window_count = 0.0
        if args.checkpoint_dir and step % args.checkpoint_every == 0:
            ckpt.save(Progress.at(step, epoch, done, per_epoch, k, args.batch_size))
    wall_seconds = time.perf_counter() - wall_start
    if args.checkpoint_dir and epoch is not None:
        ckpt.save(Progress.at(step, epoch, done, per_epoch, k, args.batch_size))
    metrics = tf.function(lambda images, labels: models.correct_and_loss_sum(model(images, False), labels),
                          reduce_retracing=True)
    evaluation = Evaluation() if models.is_simulated(model) else evaluate(metrics, dataset)
    summary = build_summary(
        "towers", args, dataset, world_size=k, steps=step, epochs=step / per_epoch,
        train_loss=window_loss / window_count if window_count else None, evaluation=evaluation,
        wall_seconds=wall_seconds, reports=[timer.report()], devices=devices, checkpoint=ckpt.latest,
        **summary_fields(args.straggler, waited.tolist()),
        gradient_bytes=sum(v.shape.num_elements() * v.dtype.size for v in model.trainable_variables))
    console.finish(summary, args.summary_json)
    if args.dump_weights:
        np.savez(parent_made(args.dump_weights), *[v.numpy() for v in model.variables])
    return 0


def make_train_step(tf, model, optimizer, devices):
    from ringtrain.workloads import models
    from ringtrain.workloads.straggler import wait_after
    k = len(devices)

    @tf.function
    def train_step(batches, extra):
        grads, loss_sums, counts, waits = [], [], [], []
        for i, (device, (images, labels, weights, global_count)) in enumerate(zip(devices, batches)):
            # Towers: forward and backward of this tower's batch on its own device.
            with tf.device(device):
                started = tf.timestamp()
                with tf.control_dependencies([started]), tf.GradientTape() as tape:
                    loss_sum = tf.reduce_sum(weights * models.per_example_loss(model(images, True), labels))
                    # the global batch's mean per-tower share, as in every other mode
                    loss = loss_sum / (global_count / k)
                tower_grads, waited = wait_after(tf, tape.gradient(loss, model.trainable_variables),
                                                 started, extra[i])  # --straggler
            grads.append(tower_grads)
            loss_sums.append(loss_sum)
            counts.append(tf.reduce_sum(weights))
            waits.append(waited)
        # Towers: the mean gradient, on the CPU, applied once.
        with tf.device("/device:CPU:0"):
            mean = [tf.add_n(list(per_var)) / k for per_var in zip(*grads)]
            optimizer.apply_gradients(zip(mean, model.trainable_variables))
            return tf.add_n(loss_sums), tf.add_n(counts), tf.stack(waits)

    return train_step
