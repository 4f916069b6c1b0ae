"""tf.data input pipelines: what one worker reads of a source
(workloads/sources.py), by the one rule of workloads/sharding.py, decoded in
parallel and prefetched, never the whole data set in memory.

Every mode reads through here: the eager modes iterate the datasets
(batches_from), the graph-mode PS iterates them as numpy in a graph of their
own (numpy_iterator), and TF2 PS's workers build them in their dataset
function (epoch_dataset). An element is one update: (images [K, b, H, W, C]
float32 in [0, 1], labels [K, b], weights [K, b], the update's real samples
over every worker), K micro-batches of b (--accumulate K)."""
import numpy as np

from ringtrain.workloads.sharding import epoch_plan, eval_shard
from ringtrain.workloads.tfenv import data_function

EVAL_BATCH = 256


def to_model_input(tf, image, shape):
    """A decoded image, or a batch of them (uint8, or floats in [0, 1]; HxWxC')
    as the model takes it: float32 in [0, 1], `shape` HxWxC (resized where its
    size differs, its channels converted)."""
    h, w, c = shape
    # (uint8 in 0..255; a factory's floats are in [0, 1] already)
    image = tf.cast(image, tf.float32) / 255.0 if image.dtype == tf.uint8 else tf.cast(image, tf.float32)
    have = image.shape[-1]
    if have != c:
        if have == 1 and c == 3:
            image = tf.image.grayscale_to_rgb(image)
        elif c == 1:
            image = tf.image.rgb_to_grayscale(image[..., :3])
        else:
            image = image[..., :c]
    if image.shape[-3] == h and image.shape[-2] == w:
        return image
    fits = tf.reduce_all(tf.equal(tf.shape(image)[-3:-1], [h, w]))
    image = tf.cond(fits, lambda: image, lambda: tf.image.resize(image, [h, w]))
    return tf.ensure_shape(image, [*image.shape[:-3], h, w, c])


def samples(tf, split, records, shape):
    """(image, label) of each record, decoded in parallel, in order."""
    def sample(*item):
        image, label = split.decode(tf, shape[-1], *item)
        return to_model_input(tf, image, shape), tf.cast(label, tf.int32)
    return records.map(data_function(sample), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def decoded_batches(tf, split, records, shape, batch_size):
    """(images, labels) of each batch_size records (the last may be short),
    decoded in parallel, in order: a batch at a time where the split can (a
    TFRecord's Examples are parsed together, each image decoded in turn),
    else a record at a time."""
    decode = getattr(split, "decode_batch", None)
    if decode is None:
        return samples(tf, split, records, shape).batch(batch_size)

    def batch(*items):
        encoded, labels = decode(tf, *items)
        images = tf.map_fn(lambda one: to_model_input(tf, split.decode_image(tf, shape[-1], one), shape), encoded,
                           fn_output_signature=tf.TensorSpec(shape, tf.float32))
        return images, labels
    return records.batch(batch_size).map(data_function(batch), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def epoch_dataset(tf, source, plan, batch_size, accumulate):
    """One worker's updates of one epoch, from a sharding.EpochPlan."""
    split, shape = source.train, source.image_shape
    if split.in_memory:  # (gathered and converted a micro-batch at a time)
        ids = np.concatenate([plan.ids, np.zeros(plan.padding, plan.ids.dtype)])
        weights = np.concatenate([np.ones(plan.real, np.float32), np.zeros(plan.padding, np.float32)])
        micro = split.batches(tf, ids, weights, batch_size).map(
            data_function(lambda images, labels, w: (to_model_input(tf, images, shape), labels, w)))
    else:
        micro = _decoded(tf, source, plan, batch_size)
    counts = tf.data.Dataset.from_tensor_slices(plan.update_counts.astype(np.float32))
    # (every update has K whole micro-batches, padding included: shapes known when traced)
    return tf.data.Dataset.zip((micro.batch(accumulate, drop_remainder=True), counts)).map(
        data_function(lambda m, count: (*m, count))).prefetch(tf.data.AUTOTUNE)


def _decoded(tf, source, plan, batch_size):
    """A worker's micro-batches of one epoch: its records decoded, the last
    short batch and then whole batches filled with weight-0 padding."""
    split, shape = source.train, source.image_shape
    if split.random_access:
        records = split.records(tf, plan.ids)
    else:
        records = split.stream(tf, plan.files)
        if source.shuffle_buffer > 1:
            records = records.shuffle(source.shuffle_buffer, seed=plan.shuffle_seed)
        records = records.shard(plan.shard[1], plan.shard[0]).skip(plan.skip).take(plan.real)

    def filled(images, labels):
        short = batch_size - tf.shape(labels)[0]
        weights = tf.concat([tf.ones_like(labels, tf.float32), tf.zeros([short])], 0)
        return (tf.ensure_shape(tf.pad(images, [[0, short], [0, 0], [0, 0], [0, 0]]), [batch_size, *shape]),
                tf.ensure_shape(tf.pad(labels, [[0, short]]), [batch_size]), tf.ensure_shape(weights, [batch_size]))
    real = decoded_batches(tf, split, records, shape, batch_size).map(data_function(filled))
    empty = (tf.zeros([batch_size, *shape]), tf.zeros([batch_size], tf.int32), tf.zeros([batch_size]))
    left = plan.padding - (-plan.real % batch_size)  # (what the last real batch's filling leaves)
    return real.concatenate(tf.data.Dataset.from_tensors(empty).repeat(left // batch_size))


def limit_threads(tf, ds, threads):
    """tf.data has its own thread pool, outside TF's intra/inter-op settings:
    with --threads T, keep it to T threads too, or ranks sharing cores fight."""
    if not threads:
        return ds
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options)


def plans_from(source, rank, size, data, epoch, skip_updates=0):
    """Worker `rank`'s EpochPlans, from a position on, without end."""
    while True:
        yield epoch, skip_updates, epoch_plan(source, rank, size, data.batch_size, data.accumulate, data.seed,
                                              epoch, skip_updates)
        epoch, skip_updates = epoch + 1, 0


def batches_from(source, rank, size, data, epoch, skip_updates=0):
    """An eager worker's updates from a position on, epoch after epoch, without
    end: (epoch, updates of that epoch done after this one, update)."""
    import tensorflow as tf

    def opened(plan):
        return iter(limit_threads(tf, epoch_dataset(tf, source, plan, data.batch_size, data.accumulate),
                                  data.threads))
    yield from _opened_ahead(plans_from(source, rank, size, data, epoch, skip_updates), opened)


def numpy_batches_from(source, rank, size, data, epoch, skip_updates=0):
    """batches_from, as numpy, for a process in TF1's graph mode."""
    def opened(plan):
        build = lambda tf: limit_threads(tf, epoch_dataset(tf, source, plan, data.batch_size, data.accumulate),
                                         data.threads)
        return numpy_iterator(build, data.threads)
    yield from _opened_ahead(plans_from(source, rank, size, data, epoch, skip_updates), opened)


def _opened_ahead(plans, open_epoch):
    """(epoch, done, element) of each epoch's iterator, open_epoch(plan). A
    helper thread opens each epoch's iterator while the one before trains, and
    deletes the spent one: at an epoch's end, making and deleting tf.data
    iterators on the training thread stalled it 0.3-2.5 s when ranks shared
    the cores (DEVELOPERS.md 4.15). When training ends (this generator closed),
    the epoch being read and the one being opened go to the helper as well,
    and nobody waits for it."""
    from concurrent.futures import ThreadPoolExecutor

    def ahead():
        epoch, skip, plan = next(plans)
        return epoch, skip, open_epoch(plan)

    helper = ThreadPoolExecutor(1, thread_name_prefix="epoch-iterators")
    upcoming, iterator = helper.submit(ahead), None
    try:
        while True:
            epoch, skip, iterator = upcoming.result()
            upcoming = helper.submit(ahead)
            for done, element in enumerate(iterator, start=skip + 1):
                yield epoch, done, element
            spent = [iterator]
            iterator = None
            helper.submit(spent.clear)  # (its last reference goes there, whenever the helper runs it)
    finally:
        upcoming.cancel()  # (if not begun)
        spent = [iterator, upcoming]
        iterator = upcoming = None
        helper.submit(spent.clear)
        helper.shutdown(wait=False)


def numpy_iterator(build, threads=0):
    """The elements of build(tf)'s dataset as numpy: eagerly where TF executes
    eagerly, else in a graph and a session of its own (TF1's graph mode)."""
    import tensorflow as tf
    if tf.executing_eagerly():
        return build(tf).as_numpy_iterator()
    return GraphIterator(tf, build, threads)


class GraphIterator:
    """A dataset's elements as numpy from a graph and a session of its own, the
    first one read as it is made (where it is made). The session closes when
    the iterator is dropped, not when it runs out: closing waits for tf.data's
    threads, and it held the training thread over 6 s at an epoch's end when
    processes shared the cores (DEVELOPERS.md 4.15)."""

    def __init__(self, tf, build, threads):
        with tf.Graph().as_default() as graph:
            iterator = tf.compat.v1.data.make_initializable_iterator(build(tf))
            self.element, start = iterator.get_next(), [iterator.initializer, tf.compat.v1.tables_initializer()]
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
        # (not the default session: the towers of in-graph replication iterate theirs by turns)
        self.session = tf.compat.v1.Session(graph=graph, config=config)  # (its __del__ closes it)
        self.out_of_range = tf.errors.OutOfRangeError
        self.session.run(start)
        self.ahead = self._read()

    def _read(self):
        try:
            return [self.session.run(self.element)]
        except self.out_of_range:
            return []

    def __iter__(self):
        return self

    def __next__(self):
        if not self.ahead:
            raise StopIteration
        element, = self.ahead
        self.ahead = self._read()
        return element


def eval_dataset(tf, source, rank, size, batch_size=EVAL_BATCH):
    """This worker's disjoint share of the test split, in order: (images, labels) batches."""
    split = source.test
    if split.random_access:
        records = split.records(tf, eval_shard(split.count, rank, size))
    else:
        records = split.stream(tf, tuple(split.files)).shard(size, rank)
    return decoded_batches(tf, split, records, source.image_shape, batch_size).prefetch(tf.data.AUTOTUNE)
