"""Horovod's synthetic Keras benchmark recipe on Keras 3, as Horovod's
examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py writes it: a
Keras Applications network on random images, hvd.DistributedOptimizer, the
broadcast and metric-average callbacks, `model.fit`. The same model, data,
flags and JSON line as examples/plain_horovod.py (the GradientTape recipe), so
that `ringtrain-bench parity --recipe keras-fit` can run the two side by side.

    mpirun -np 2 python examples/keras_synthetic_benchmark.py --model ResNet50 --batch-size 16 --steps 30

It prints one JSON line, with images/s measured as plain_horovod.py measures
it: every rank's timed samples over the slowest rank's timed seconds, the
warm-up steps excluded. A step's time runs from the end of the step before,
so it holds whatever fit does between steps (callbacks, epoch ends).
"""
import time

import horovod.tensorflow.keras as hvd
import keras
import numpy as np
import tensorflow as tf

import plain_scripts  # (beside this script: the flags and the network every plain script shares)

p = plain_scripts.parser(__doc__)
p.add_argument("--steps-per-epoch", type=int, default=10,
               help="as Horovod's recipe: epochs of 10 batches (the last epoch runs whole)")
p.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression of the gradients")
args = p.parse_args()

# Horovod: initialise, and pin TF's thread pools as the ranks share the machine.
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(args.threads)

shape = tuple(int(d) for d in args.image_shape.split("x"))
keras.utils.set_random_seed(hvd.rank())
model = plain_scripts.build(args.model, shape, args.classes)
next_batch, dataset = plain_scripts.batches(args, shape, seed=hvd.rank())
if dataset is None:  # (--input constant)
    dataset = tf.data.Dataset.from_tensors(next_batch()).repeat()  # one batch, again and again

# Horovod: average the gradients over the ranks in apply_gradients (optionally sent as fp16).
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr), compression=compression)
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class StepTimes(keras.callbacks.Callback):
    """When each step ended: a step's time is from the end of the one before."""

    def on_train_begin(self, logs=None):
        self.ends = [time.perf_counter()]

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


timer = StepTimes()
callbacks = [
    # Horovod: every rank starts from rank 0's weights.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: each epoch's loss, averaged over the ranks.
    hvd.callbacks.MetricAverageCallback(),
    timer,
]
steps_per_epoch = min(args.steps_per_epoch, args.steps)
model.fit(dataset, steps_per_epoch=steps_per_epoch, epochs=-(-args.steps // steps_per_epoch), callbacks=callbacks,
          verbose=0, shuffle=False)  # (a dataset: fit never shuffles one)

step_seconds = np.diff(timer.ends)[args.warmup_steps:args.steps]
# Horovod: every rank's timed seconds, so that the rate is the job's, not rank 0's times N.
seconds = [float(s) for s in hvd.allgather([float(step_seconds.sum())])]
if hvd.rank() == 0:
    plain_scripts.print_result(step_seconds.tolist(), seconds, hvd.size(), args)
