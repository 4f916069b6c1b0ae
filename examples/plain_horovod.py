"""A plain Horovod script, as Horovod's own examples/tensorflow2 write one: a
Keras Applications network on random images, DistributedGradientTape, and a
timer. Nothing of ringtrain's. `ringtrain-bench parity` runs it beside
`ringtrain` on the same model, batch, optimizer and threads.

    mpirun -np 2 python examples/plain_horovod.py --model ResNet50 --batch-size 16 --steps 30

It prints one JSON line, with images/s measured as ringtrain measures it:
every rank's timed samples over the slowest rank's timed seconds.
"""
import argparse
import json
import os
import time

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

import plain_models  # (beside this script: the network, a keras.applications name or mnist_cnn)

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--model", default="ResNet50", help="a keras.applications name, or mnist_cnn")
p.add_argument("--image-shape", default="32x32x3", help="HxWxC")
p.add_argument("--classes", type=int, default=10)
p.add_argument("--batch-size", type=int, default=16, help="per rank")
p.add_argument("--steps", type=int, default=30, help="steps in all, the warm-up included")
p.add_argument("--warmup-steps", type=int, default=3, help="not timed")
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--threads", type=int, default=1, help="TF's intra- and inter-op threads")
args = p.parse_args()

# Horovod: initialise, and pin TF's thread pools as the ranks share the machine.
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(args.threads)


shape = tuple(int(d) for d in args.image_shape.split("x"))
keras.utils.set_random_seed(hvd.rank())
model = plain_models.build(args.model, shape, args.classes)
optimizer = keras.optimizers.SGD(args.lr)
optimizer.build(model.trainable_variables)
rng = np.random.default_rng(hvd.rank())
images = tf.constant(rng.random((args.batch_size, *shape), np.float32))
labels = tf.constant(rng.integers(0, args.classes, args.batch_size))
loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def train_step():
    with tf.GradientTape() as tape:
        loss = loss_of(labels, model(images, training=True))
    # Horovod: each gradient's allreduce starts as soon as backprop produces it.
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


# Horovod: every rank starts from rank 0's weights.
hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
step_seconds = []
for step in range(args.steps):
    start = time.perf_counter()
    train_step().numpy()
    if step >= args.warmup_steps:
        step_seconds.append(time.perf_counter() - start)

# Horovod: every rank's timed seconds, so that the rate is the job's, not rank 0's times N.
seconds = hvd.allgather_object(sum(step_seconds))
samples = hvd.size() * args.batch_size * len(step_seconds)
if hvd.rank() == 0:
    print(json.dumps({"images_per_sec": samples / max(seconds), "world_size": hvd.size(),
                      "timed_samples": samples, "timed_seconds": max(seconds),
                      "images_per_sec_per_worker": [samples / hvd.size() / s for s in seconds],
                      "step_time_p50_sec": float(np.median(step_seconds)),
                      "mpi_settings": {k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA_")}}),
          flush=True)
