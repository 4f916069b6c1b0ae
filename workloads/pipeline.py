"""tf.data input pipelines over a Dataset and a rank's shard."""
import numpy as np
import tensorflow as tf

from workloads.sharding import epoch_shard, eval_shard


def _to_float(images):
    return tf.cast(images, tf.float32) / 255.0


def train_batches(dataset, rank, size, batch_size, seed, epoch, skip_batches=0):
    """(images, labels, weights, global_count) batches of one epoch for one rank."""
    shard = epoch_shard(len(dataset.train_labels), rank, size, batch_size, seed, epoch)
    samples = tf.data.Dataset.from_tensor_slices((
        dataset.train_images[shard.indices], dataset.train_labels[shard.indices], shard.weights))
    batches = tf.data.Dataset.zip((samples.batch(batch_size),
                                   tf.data.Dataset.from_tensor_slices(shard.global_counts)))
    return (batches.skip(skip_batches)
            .map(lambda b, count: (_to_float(b[0]), b[1], b[2], count),
                 num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))


def eval_batches(dataset, rank, size, batch_size):
    idx = eval_shard(len(dataset.test_labels), rank, size)
    samples = tf.data.Dataset.from_tensor_slices((dataset.test_images[idx],
                                                  dataset.test_labels[idx]))
    return samples.batch(batch_size).map(lambda x, y: (_to_float(x), y)).prefetch(tf.data.AUTOTUNE)


def as_float(images):
    """numpy uint8 -> float32 in [0, 1], for graph-mode feeds."""
    return images.astype(np.float32) / 255.0
