"""Run under horovodrun -np 2: Horovod's TF API on Keras 3 variables (patched
Horovod). Prints one JSON line per rank for the test to check."""
import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
keras.utils.set_random_seed(hvd.rank())  # different initial weights per rank on purpose

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                          hvd.SyncBatchNormalization(), keras.layers.Dense(2)])
local_head = keras.layers.Dense(2)  # a rank-local layer for PartialDistributedGradientTape
local_head.build((None, 2))
optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
optimizer.build(model.trainable_variables)
hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
x = tf.random.stateless_normal([16, 4], seed=[hvd.rank(), 7])


@tf.function
def step(partial):
    with tf.GradientTape() as tape:
        out = model(x, training=True)
        loss = tf.reduce_mean(tf.square(out)) + tf.reduce_mean(tf.square(local_head(out)))
    if partial:
        tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local_head])
    else:
        tape = hvd.DistributedGradientTape(tape)
    variables = model.trainable_variables + local_head.trainable_variables
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(grads[:len(model.trainable_variables)],
                                  model.trainable_variables))
    return loss


for i in range(4):
    step(partial=i % 2 == 1)
bn = model.layers[1]
flat = np.concatenate([v.numpy().ravel() for v in model.variables])
# Digests keep the line short: horovodrun splits long lines, and writes in parts.
digest = lambda array: hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
sys.stdout.write(json.dumps({"rank": hvd.rank(), "weights_sha256": digest(flat),
                             "bn_moving_mean_sha256": digest(bn.moving_mean.numpy())}) + "\n")
sys.stdout.flush()
