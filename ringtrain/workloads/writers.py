"""Images written in the formats --data reads, as TensorFlow's own tools
write them: TFRecord files of tf.train.Examples (an encoded image and an
int64 label, ImageNet's keys by default) and folders of class folders. The
bench writes the images of an in-memory source this way to time reading them
from disk against reading them from memory; the tests write the embedded
MNIST digits. Imports TensorFlow."""
import os

import numpy as np

from ringtrain.workloads.tfrecords import IMAGE_KEY, LABEL_KEY


def encoded(tf, image, fmt="png"):
    """One uint8 HxWxC image as PNG (lossless) or JPEG bytes."""
    if fmt == "png":
        return tf.io.encode_png(image).numpy()
    return tf.io.encode_jpeg(image, quality=95).numpy()


def example(tf, image_bytes, label, image_key=IMAGE_KEY, label_key=LABEL_KEY):
    """A serialized tf.train.Example of one image."""
    return tf.train.Example(features=tf.train.Features(feature={
        image_key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_bytes])),
        label_key: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
        "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"PNG"]))})).SerializeToString()


def write_tfrecords(images, labels, prefix, files=4, fmt="png", image_key=IMAGE_KEY, label_key=LABEL_KEY, seed=0):
    """images (uint8 NHWC) and labels as `files` TFRecord files PREFIX-0000i-of-0000N,
    in a seeded random order (as ImageNet's conversion script shuffles them,
    so that no file holds one class); returns their paths."""
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    tf = import_tensorflow_quietly()
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    paths = [f"{prefix}-{i:05d}-of-{files:05d}" for i in range(files)]
    bounds = np.linspace(0, len(labels), files + 1).astype(int)
    for path, start, end in zip(paths, bounds[:-1], bounds[1:]):
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(start, end):
                writer.write(example(tf, encoded(tf, images[i], fmt), labels[i], image_key, label_key))
    return paths


def write_folder(images, labels, root, class_names=None, fmt="png"):
    """images and labels as ROOT/CLASS/NNNNN.png, one folder per class; returns root."""
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    tf = import_tensorflow_quietly()
    names = class_names or [f"class_{c}" for c in range(int(labels.max()) + 1)]
    for name in names:
        os.makedirs(os.path.join(root, name), exist_ok=True)
    for i, (image, label) in enumerate(zip(images, labels)):
        with open(os.path.join(root, names[label], f"{i:05d}.{fmt}"), "wb") as f:
            f.write(encoded(tf, image, fmt))
    return root
