"""Where the training data comes from: one abstraction for every mode.

`--data` names a source:
- `mnist`, `cifar10`, `synthetic`: arrays in memory (workloads/data.py);
- a glob of TFRecord files of tf.train.Examples (workloads/tfrecords.py),
  feature keys --image-key and --label-key (ImageNet's by default);
- a folder of class folders of images (workloads/images.py);
- `package.module:function`, a factory that returns a tf.data.Dataset of
  (image, label), or a (train, test) pair of them.

A Source is checked here, with numpy and the standard library only (a
factory is called, which imports TensorFlow): a bad input is one line before
training starts, on every process alike. What each process reads of it, and
in which order, is workloads/sharding.py's one rule; how it is read,
workloads/pipeline.py's. Every image is read at the model's input shape
(resized, its channels converted), as float32 in [0, 1].

Two kinds of split: random access (arrays, image folders: any record by its
number) and streams (TFRecord files, a factory's dataset: read in order).
"""
import glob
import os
from dataclasses import dataclass, field

import numpy as np

from ringtrain.common.errors import UsageError
from ringtrain.workloads import data as builtin
from ringtrain.workloads import images, tfrecords, user_models

BUILTIN = builtin.DATASETS  # mnist, cifar10, synthetic
SHARD_BY = ("auto", "file", "record")


# --- splits ---------------------------------------------------------------------------

@dataclass
class ArraySplit:
    """Images in memory (uint8 NHWC) and their labels."""
    images: np.ndarray
    labels: np.ndarray
    random_access = True
    files = ()
    _tensors = None

    @property
    def count(self):
        return len(self.labels)

    in_memory = True

    def keep_as_tensors(self, tf):
        """Keep one copy as eager tensors, gathered from by index (a remote
        dataset function captures it once, not each epoch's share)."""
        self._tensors = (tf.constant(self.images), tf.constant(self.labels))

    def batches(self, tf, ids, weights, batch_size):
        """(uint8 images, labels, weights) of records `ids`, batch_size at a time."""
        if self._tensors is not None:
            images_, labels = self._tensors
            return tf.data.Dataset.from_tensor_slices((ids, weights)).batch(batch_size, drop_remainder=True).map(
                lambda i, w: (tf.gather(images_, i), tf.gather(labels, i), w))
        return tf.data.Dataset.from_tensor_slices((self.images[ids], self.labels[ids], weights)).batch(
            batch_size, drop_remainder=True)

    def records(self, tf, ids):
        """Records `ids`: (uint8 image, label) each (the test split)."""
        return tf.data.Dataset.from_tensor_slices((self.images[ids], self.labels[ids]))

    def decode(self, tf, channels, image, label):
        return image, label


@dataclass
class FolderSplit:
    """Image files, one record each, labelled by their class folder."""
    paths: np.ndarray
    labels: np.ndarray
    random_access = True
    in_memory = False

    @property
    def count(self):
        return len(self.labels)

    @property
    def files(self):
        return tuple(self.paths)

    def records(self, tf, ids):
        return tf.data.Dataset.from_tensor_slices((self.paths[ids], self.labels[ids]))

    def decode_batch(self, tf, paths, labels):
        """(what decode_image takes, labels) of a batch of records: their paths."""
        return paths, labels

    def decode_image(self, tf, channels, path):
        return tf.io.decode_image(tf.io.read_file(path), channels=channels, expand_animations=False)


@dataclass
class RecordSplit:
    """TFRecord files of tf.train.Examples, read in order."""
    files: tuple
    counts: tuple        # records of each file that are read (bad ones left out)
    bad: dict            # file -> record numbers left out (--skip-bad-images)
    image_key: str = tfrecords.IMAGE_KEY
    label_key: str = tfrecords.LABEL_KEY
    random_access = in_memory = False
    CYCLE = 4  # files read side by side

    @property
    def count(self):
        return sum(self.counts)

    def stream(self, tf, files):
        """The records of `files`, in that order (serialized Examples)."""
        files = tf.data.Dataset.from_tensor_slices(list(files))
        # (a few files read side by side, a record of each in turn: mixed, in one order every time)
        read = lambda make: files.interleave(make, cycle_length=min(len(self.files), self.CYCLE),
                                             num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if not self.bad:
            return read(tf.data.TFRecordDataset)
        keys = [f"{f}#{n}" for f, numbers in self.bad.items() for n in numbers]
        left_out = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, [1] * len(keys)), 0)
        numbered = read(lambda f: tf.data.TFRecordDataset(f).enumerate().map(
            lambda n, record: (tf.strings.join([f, "#", tf.strings.as_string(n)]), record)))
        return numbered.filter(lambda key, record: tf.equal(left_out.lookup(key), 0)).map(lambda key, record: record)

    def decode_batch(self, tf, records):
        """(encoded images, labels) of a batch of serialized Examples, parsed together."""
        parsed = tf.io.parse_example(records, {self.image_key: tf.io.FixedLenFeature([], tf.string),
                                               self.label_key: tf.io.FixedLenFeature([], tf.int64)})
        return parsed[self.image_key], tf.cast(parsed[self.label_key], tf.int32)

    def decode_image(self, tf, channels, encoded):
        return tf.io.decode_image(encoded, channels=channels, expand_animations=False)


@dataclass
class FactorySplit:
    """A dataset of the user's own code: `make(tf)` builds it in the graph at hand."""
    make: object
    count: int
    random_access = in_memory = False
    files = ()

    def stream(self, tf, files=None):
        return self.make(tf)

    def decode(self, tf, channels, image, label):
        return (image[..., None] if image.shape.rank == 2 else image), label


# --- the source ---------------------------------------------------------------------

@dataclass
class Source:
    name: str            # the summary's "data": mnist, cifar10, synthetic, tfrecord, folder, factory
    where: str           # what --data named: a folder, a glob, a function
    image_shape: tuple   # the model's input: every image is read at it
    num_classes: int
    train: object        # a split
    test: object = None  # a split, or None: no test split
    shard_by: str = "auto"
    skipped: list = field(default_factory=list)  # (where, why) of images left out (--skip-bad-images)
    shuffle_buffer: int = 1024  # a stream's records shuffled in a window of this many

    @property
    def streams(self):
        return not self.train.random_access

    def sharding(self, workers):
        """How `workers` share each epoch: "file" (each reads whole files of
        its own) or "record" (each reads every workers-th record of the
        epoch's order). auto: by file where there are at least as many files as
        workers (as tf.data's AUTO shard policy), by record otherwise."""
        files = len(self.train.files) if isinstance(self.train, RecordSplit) else 0
        if self.shard_by == "file":
            if not files:
                raise UsageError(f"--shard-by file deals whole TFRecord files to the workers, and {self.where} "
                                 "has none to deal: drop --shard-by file")
            if files < workers:
                raise UsageError(f"--shard-by file: {self.where} has {files} file(s) for {workers} workers: give "
                                 "at least as many files as workers, or --shard-by record")
        if self.shard_by == "file" or (self.shard_by == "auto" and files >= workers > 0):
            return "file"
        return "record"

    def describe(self, workers):
        """The run's first line's account of the data."""
        split = f"{self.train.count} train, {self.test.count if self.test else 0} test"
        how = self.sharding(workers)
        if isinstance(self.train, FolderSplit):
            how = "by file (an image each)"
        elif isinstance(self.train, RecordSplit):
            how = f"by {how} ({len(self.train.files)} files)"
        else:
            how = f"by {how}"
        notes = [f"{len(self.skipped)} bad image(s) left out"] if self.skipped else []
        if self.test is None:
            notes.append("no test split (--test-data)")
        shape = "x".join(str(d) for d in self.image_shape)
        return (f"{self.where} ({split}; {self.num_classes} classes; read at {shape}; sharded {how}"
                + "".join(f"; {n}" for n in notes) + ")")


def synthetic_note(source, model):
    """What a run on random images should say first: it learns nothing."""
    if source.name == "synthetic":
        return (f"note: {model} trains on random images with random labels (--data synthetic): it ends at chance "
                "accuracy")
    return None


# --- opening what the flags name -----------------------------------------------------

@dataclass(frozen=True)
class Request:
    """What the data flags ask for (flags.py reads them into it)."""
    data: str
    test_data: str = None
    data_dir: str = None
    image_key: str = tfrecords.IMAGE_KEY
    label_key: str = tfrecords.LABEL_KEY
    shard_by: str = "auto"
    shuffle_buffer: int = 1024
    skip_bad_images: bool = False
    num_classes: int = None
    seed: int = 0


def open_source(request, image_shape, model_classes=None, model="the model"):
    """The Source `request` names, checked, its images read at `image_shape`;
    `model_classes`: the classes a catalog model has (None: a model of the
    user's own, built for the data's classes)."""
    if isinstance(request.data, str) and request.data in BUILTIN:
        loaded = builtin.load(request.data, request.data_dir, image_shape, request.seed)
        source = Source(request.data, loaded.source, tuple(image_shape), builtin.NUM_CLASSES,
                        ArraySplit(loaded.train_images, loaded.train_labels),
                        ArraySplit(loaded.test_images, loaded.test_labels))
    else:
        source = _open_files(request, image_shape)
    if request.test_data:
        kind, test, _ = _open(request.test_data, request, "--test-data", classes_of(source.train))
        source.test = test
    if request.num_classes:
        if request.data in BUILTIN and request.num_classes != builtin.NUM_CLASSES:
            raise UsageError(f"--num-classes {request.num_classes}: {request.data} has {builtin.NUM_CLASSES} classes")
        source.num_classes = request.num_classes
    source.shard_by, source.shuffle_buffer = request.shard_by, request.shuffle_buffer
    check_labels(source, model_classes, model, given=bool(request.num_classes))
    return source


def _open_files(request, image_shape):
    kind, train, test = _open(request.data, request, "--data")
    where = request.data if isinstance(request.data, str) else f"{request.data[0]} and {len(request.data) - 1} more"
    if test is None and not request.test_data and isinstance(request.data, str):
        sibling = _sibling(request.data)
        if sibling:
            test = _open(sibling, request, "--data's test split", classes_of(train))[1]
    skipped = getattr(train, "dropped", []) + (getattr(test, "dropped", []) if test is not None else [])
    return Source(kind, where, tuple(image_shape), _classes_found(train, test), train, test, skipped=skipped)


def _open(text, request, flag, classes=None):
    """(kind, split, a factory's test split or None) of what `text` names
    (a tuple: the files of a glob the shell expanded)."""
    if isinstance(text, tuple):
        missing = [f for f in text if not os.path.isfile(f)]
        if missing:
            raise UsageError(f"{flag}: {missing[0]} is not a file: give a glob of TFRecord files (quoted, e.g. "
                             "'/data/train-*'), or the files themselves")
        return "tfrecord", _record_split(sorted(text), request), None
    if user_models.FACTORY.match(text) and not os.path.exists(text):
        from ringtrain.workloads import factories
        splits = []
        for make, count, label_range in factories.open_factory(text, flag):
            split = FactorySplit(make, count)
            split.label_range, split.dropped = label_range, []
            splits.append(split)
        return "factory", splits[0], (splits[1] if len(splits) > 1 else None)
    if os.path.isdir(text):
        classes = classes or images.class_names(text, flag)
        paths, labels, dropped = images.list_folder(text, classes, request.skip_bad_images, flag)
        split = FolderSplit(paths, labels)
        split.class_names, split.dropped = classes, dropped
        return "folder", split, None
    files = sorted(f for f in glob.glob(text) if os.path.isfile(f))
    if not files:
        raise UsageError(f"{flag} {text} matches no file: give a glob of TFRecord files (e.g. /data/train-*), a "
                         f"folder of class folders, package.module:function, or one of {', '.join(BUILTIN)}")
    return "tfrecord", _record_split(files, request), None


def _record_split(files, request):
    counts, bad, labels, dropped = [], {}, [], []
    for path in files:
        found = tfrecords.index(path, request.image_key, request.label_key)
        if len(found.bad) and not request.skip_bad_images:
            raise UsageError(f"{path}: the image of record {found.bad[0]} does not decode: {found.reasons[0]}: "
                             "replace it, or pass --skip-bad-images to leave such records out")
        keep = np.ones(len(found.labels), bool)
        keep[found.bad] = False
        counts.append(int(keep.sum()))
        labels.append(found.labels[keep])
        if len(found.bad):
            bad[path] = [int(n) for n in found.bad]
            dropped += [(f"{path} record {n}", why) for n, why in zip(found.bad, found.reasons)]
    split = RecordSplit(tuple(files), tuple(counts), bad, request.image_key, request.label_key)
    split.label_values, split.label_files, split.dropped = labels, files, dropped
    return split


def _sibling(text):
    """The test split beside a training split named with "train": the same path
    with "validation", "val" or "test" in its place, if that matches anything."""
    at = text.rfind("train")
    if at < 0:
        return None
    for word in ("validation", "val", "test"):
        candidate = text[:at] + word + text[at + len("train"):]
        if os.path.isdir(candidate) or any(os.path.isfile(f) for f in glob.glob(candidate)):
            return candidate
    return None


def classes_of(split):
    return getattr(split, "class_names", None)


def _classes_found(train, test):
    if isinstance(train, FolderSplit):
        return len(train.class_names)
    highest = max(_label_range(s)[1] for s in (train, test) if s is not None)
    return max(highest + 1, 1)


def _label_range(split):
    """(lowest, highest) label of a split, and where each is."""
    if isinstance(split, (ArraySplit, FolderSplit)):
        return (int(split.labels.min()), int(split.labels.max())) if split.count else (0, 0)
    if isinstance(split, RecordSplit):
        values = [v for v in split.label_values if len(v)]
        return (min(int(v.min()) for v in values), max(int(v.max()) for v in values)) if values else (0, 0)
    return split.label_range


def check_labels(source, model_classes, model, given=False):
    """Every label is a class the model has: 0..C-1 (C: a catalog model's, or
    --num-classes where `given`, else the data's own)."""
    classes = model_classes or source.num_classes
    whose = (f"{model}'s {classes} classes" if model_classes else
             f"the {classes} classes of --num-classes" if given else f"{classes} classes")
    fix = ("train a model of your own (--model package.module:function), which is built for the data's classes, "
           "or relabel the data" if model_classes else
           "give --num-classes above it, or relabel" if given else "labels are class indices from 0: relabel")
    for split in (source.train, source.test):
        if split is None:
            continue
        low, high = _label_range(split)
        if low < 0 or high >= classes:
            bad = low if low < 0 else high
            raise UsageError(f"{source.where}: label {bad}{_where_label(split, bad)} is outside {whose} "
                             f"(0..{classes - 1}): {fix}")


def _where_label(split, label):
    if isinstance(split, RecordSplit):
        for path, values in zip(split.label_files, split.label_values):
            hits = np.flatnonzero(values == label)
            if len(hits):
                return f" (in {path}, record {int(hits[0])} of those read)"
    if isinstance(split, FolderSplit):
        return f" (class folder {split.class_names[label] if 0 <= label < len(split.class_names) else '?'})"
    return ""
