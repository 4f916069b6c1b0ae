"""A plain Horovod script, as Horovod's own examples/tensorflow2 write one: a
Keras Applications network on random images (one batch, or read through
tf.data with --input tf.data), DistributedGradientTape, and a timer. Nothing
of ringtrain's. `ringtrain-bench parity` runs it beside `ringtrain` on the
same model, batch, optimizer and threads.

    mpirun -np 2 python examples/plain_horovod.py --model ResNet50 --batch-size 16 --steps 30

It prints one JSON line, with images/s measured as ringtrain measures it:
every rank's timed samples over the slowest rank's timed seconds.
"""

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

import plain_scripts  # (beside this script: the flags and the network every plain script shares)

args = plain_scripts.parser(__doc__).parse_args()

# Horovod: initialise, and pin TF's thread pools as the ranks share the machine.
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(args.threads)


shape = tuple(int(d) for d in args.image_shape.split("x"))
keras.utils.set_random_seed(hvd.rank())
model = plain_scripts.build(args.model, shape, args.classes)
optimizer = keras.optimizers.SGD(args.lr)
optimizer.build(model.trainable_variables)
next_batch, _ = plain_scripts.batches(args, shape, seed=hvd.rank())
loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def train_step(images, labels):
    with tf.GradientTape() as tape:
        loss = loss_of(labels, model(images, training=True))
    # Horovod: each gradient's allreduce starts as soon as backprop produces it.
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


# Horovod: every rank starts from rank 0's weights.
hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
step_seconds = plain_scripts.timed_steps(lambda: train_step(*next_batch()).numpy(), args)
# Horovod: every rank's timed seconds, so that the rate is the job's, not rank 0's times N.
seconds = hvd.allgather_object(sum(step_seconds))
if hvd.rank() == 0:
    plain_scripts.print_result(step_seconds, seconds, hvd.size(), args)
