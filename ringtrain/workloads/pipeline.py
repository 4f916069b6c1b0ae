"""tf.data input pipelines over a Dataset and a rank's shard."""
import tensorflow as tf

from ringtrain.workloads.sharding import epoch_shard


def _to_float(images):
    return tf.cast(images, tf.float32) / 255.0


def _limit_threads(ds, threads):
    """tf.data has its own thread pool, outside TF's intra/inter-op settings:
    with --threads T, keep it to T threads too, or ranks sharing cores fight."""
    if not threads:
        return ds
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options)


def train_batches(dataset, rank, size, batch_size, seed, epoch, skip_batches=0, threads=0):
    """(images, labels, weights, global_count) batches of one epoch for one rank."""
    shard = epoch_shard(len(dataset.train_labels), rank, size, batch_size, seed, epoch)
    samples = tf.data.Dataset.from_tensor_slices((
        dataset.train_images[shard.indices], dataset.train_labels[shard.indices], shard.weights))
    batches = tf.data.Dataset.zip((samples.batch(batch_size),
                                   tf.data.Dataset.from_tensor_slices(shard.global_counts)))
    return _limit_threads(batches.skip(skip_batches)
                          .map(lambda b, count: (_to_float(b[0]), b[1], b[2], count),
                               num_parallel_calls=tf.data.AUTOTUNE)
                          .prefetch(tf.data.AUTOTUNE), threads)


def batches_from(dataset, rank, size, batch_size, seed, epoch, skip_batches=0, threads=0):
    """Training batches from a position on, epoch after epoch, without end:
    (epoch, batches of that epoch done after this one, batch)."""
    while True:
        batches = train_batches(dataset, rank, size, batch_size, seed, epoch, skip_batches, threads)
        for done, batch in enumerate(batches, start=skip_batches + 1):
            yield epoch, done, batch
        epoch, skip_batches = epoch + 1, 0
