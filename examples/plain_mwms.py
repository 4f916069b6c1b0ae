"""A plain MultiWorkerMirroredStrategy script, as TensorFlow's own
distributed-training guide writes a custom loop: a Keras Applications
network on random images, `strategy.run`, the optimizer's own all-reduce, and
a timer. Nothing of ringtrain's. `ringtrain-bench parity --peer mwms` runs it
beside `ringtrain --backend tf-collective` on the same model, batch, optimizer
and threads.

    mpirun -np 2 python examples/plain_mwms.py --model ResNet50 --batch-size 16 --steps 30

Each worker needs its TF_CONFIG, as TF's guide sets it by hand; under mpirun
the workers make it here from their ranks (free ports, shared with mpi4py).
It prints one JSON line, with images/s measured as ringtrain measures it:
every worker's timed samples over the slowest worker's timed seconds.
"""
import argparse
import json
import os
import socket
import time

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--model", default="ResNet50", help="a keras.applications name, or mnist_cnn")
p.add_argument("--image-shape", default="32x32x3", help="HxWxC")
p.add_argument("--classes", type=int, default=10)
p.add_argument("--batch-size", type=int, default=16, help="per worker")
p.add_argument("--steps", type=int, default=30, help="steps in all, the warm-up included")
p.add_argument("--warmup-steps", type=int, default=3, help="not timed")
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--threads", type=int, default=1, help="TF's intra- and inter-op threads")
args = p.parse_args()


def tf_config_from_mpirun():
    """TF_CONFIG for this rank: each worker's host and a free port, all-gathered."""
    from mpi4py import MPI
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    comm = MPI.COMM_WORLD
    workers = comm.allgather(f"{socket.gethostname()}:{port}")
    rank = comm.Get_rank()
    MPI.Finalize()
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})


if "TF_CONFIG" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
    os.environ["TF_CONFIG"] = tf_config_from_mpirun()

import keras  # noqa: E402 (TF_CONFIG first: the strategy reads it)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import plain_models  # noqa: E402 (beside this script: the network, a keras.applications name or mnist_cnn)

tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(args.threads)
# TF: the workers meet through TF_CONFIG; RING is TF's own two-pass ring.
strategy = tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING))
rank, size = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync


shape = tuple(int(d) for d in args.image_shape.split("x"))
keras.utils.set_random_seed(rank)
with strategy.scope():
    # TF: variables mirrored on every worker, created alike.
    model = plain_models.build(args.model, shape, args.classes)
    optimizer = keras.optimizers.SGD(args.lr)
    optimizer.build(model.trainable_variables)
rng = np.random.default_rng(rank)
images = tf.constant(rng.random((args.batch_size, *shape), np.float32))
labels = tf.constant(rng.integers(0, args.classes, args.batch_size))
loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


@tf.function
def train_step():
    def replica_step():
        with tf.GradientTape() as tape:
            # TF: each worker's loss over the global batch, so that the SUM of the gradients is its mean.
            loss = tf.nn.compute_average_loss(loss_of(labels, model(images, training=True)),
                                              global_batch_size=args.batch_size * size)
        grads = tape.gradient(loss, model.trainable_variables)
        # TF: the optimizer all-reduces the gradients (SUM) and applies them on every worker alike.
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.reduce("SUM", strategy.run(replica_step), axis=None)


step_seconds = []
for step in range(args.steps):
    start = time.perf_counter()
    train_step().numpy()
    if step >= args.warmup_steps:
        step_seconds.append(time.perf_counter() - start)

# TF: every worker's timed seconds, so that the rate is the job's, not worker 0's times N.
seconds = strategy.gather(tf.constant([sum(step_seconds)], tf.float64), axis=0).numpy().tolist()
samples = size * args.batch_size * len(step_seconds)
if rank == 0:
    print(json.dumps({"images_per_sec": samples / max(seconds), "world_size": size,
                      "timed_samples": samples, "timed_seconds": max(seconds),
                      "images_per_sec_per_worker": [samples / size / s for s in seconds],
                      "step_time_p50_sec": float(np.median(step_seconds))}), flush=True)
