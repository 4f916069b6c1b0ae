"""Horovod's elastic Keras recipe on Keras 3 (patch 0007), as
examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py writes it:
hvd.elastic.KerasState, its three callbacks, model.fit inside hvd.elastic.run.
Run under horovodrun --gloo's elastic mode; the test kills a rank. Each rank
prints "epoch N: R ranks" lines and, at the end, one JSON line with its
world sizes, the state's epoch and a digest of its weights.
Usage: keras_elastic.py EPOCHS STEPS_PER_EPOCH
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow.keras as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

EPOCHS, STEPS = int(sys.argv[1]), int(sys.argv[2])
BATCH, LR = 8, 0.01

hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

x_all = np.random.RandomState(0).normal(size=(4096, 16)).astype("float32")
y_all = (x_all @ np.random.RandomState(1).normal(size=(16, 1))).astype("float32")
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
# Horovod: scale the learning rate by the number of ranks, average gradients in apply_gradients.
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(LR * hvd.size(), momentum=0.9))
model.compile(optimizer=optimizer, loss="mse")
# Horovod: the optimizer's variables exist before the state saves them (Keras 2 needed a step of fit).
optimizer.build(model.trainable_variables)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)
world_sizes = [hvd.size()]


def on_state_reset():
    # Horovod: a new world: a new learning rate (Keras 3: assign learning_rate, not lr).
    state.model.optimizer.learning_rate = LR * hvd.size()
    world_sizes.append(hvd.size())


state.register_reset_callbacks([on_state_reset])


class Progress(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:
            print(f"epoch {state.epoch}: {hvd.size()} ranks, loss {logs['loss']:.4f}", flush=True)


callbacks = [
    # Horovod: the state's epoch and batch follow training; a commit every 4 batches.
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=4),
    Progress(),
]


@hvd.elastic.run
def train(state):
    # Horovod: this world's shard of the data, rebuilt whenever the world changes.
    rows = np.arange(hvd.rank(), len(x_all), hvd.size())
    dataset = tf.data.Dataset.from_tensor_slices((x_all[rows], y_all[rows])).repeat().batch(BATCH)
    state.model.fit(dataset, steps_per_epoch=STEPS, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0)


train(state)
flat = np.concatenate([w.ravel() for w in model.get_weights()])
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "world_sizes": world_sizes, "epoch": state.epoch,
                  "weights_sha256": hashlib.sha256(flat.tobytes()).hexdigest()[:16]}), flush=True)
