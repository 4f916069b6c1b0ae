"""A plain MultiWorkerMirroredStrategy script, as TensorFlow's own
distributed-training guide writes a custom loop: a Keras Applications
network on random images (one batch, or read through tf.data with --input
tf.data), `strategy.run`, the optimizer's own all-reduce, and a timer.
Nothing of ringtrain's. `ringtrain-bench parity --recipe tf-collective` runs
it beside `ringtrain --backend tf-collective` on the same model, batch,
optimizer and threads.

    mpirun -np 2 python examples/plain_mwms.py --model ResNet50 --batch-size 16 --steps 30

Each worker needs its TF_CONFIG, as TF's guide sets it by hand; under mpirun
the workers make it here from their ranks (free ports, shared with mpi4py).
It prints one JSON line, with images/s measured as ringtrain measures it:
every worker's timed samples over the slowest worker's timed seconds.
"""
import json
import os
import socket

import plain_scripts  # (beside this script: the flags and the network every plain script shares)

args = plain_scripts.parser(__doc__).parse_args()


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
import tensorflow as tf  # noqa: E402


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
    model = plain_scripts.build(args.model, shape, args.classes)
    optimizer = keras.optimizers.SGD(args.lr)
    optimizer.build(model.trainable_variables)
next_batch, dataset = plain_scripts.batches(args, shape, seed=rank)
if dataset is not None:  # TF: each worker reads its own batches (nothing to shard: its own images)
    distributed = iter(strategy.distribute_datasets_from_function(lambda context: dataset))
    next_batch = lambda: next(distributed)  # noqa: E731
loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


@tf.function
def train_step(images, labels):
    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            # TF: each worker's loss over the global batch, so that the SUM of the gradients is its mean.
            loss = tf.nn.compute_average_loss(loss_of(labels, model(images, training=True)),
                                              global_batch_size=args.batch_size * size)
        grads = tape.gradient(loss, model.trainable_variables)
        # TF: the optimizer all-reduces the gradients (SUM) and applies them on every worker alike.
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.reduce("SUM", strategy.run(replica_step, args=(images, labels)), axis=None)


step_seconds = plain_scripts.timed_steps(lambda: train_step(*next_batch()).numpy(), args)
# TF: every worker's timed seconds, so that the rate is the job's, not worker 0's times N.
seconds = strategy.gather(tf.constant([sum(step_seconds)], tf.float64), axis=0).numpy().tolist()
if rank == 0:
    plain_scripts.print_result(step_seconds, seconds, size, args)
