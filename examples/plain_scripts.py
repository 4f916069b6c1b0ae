"""What the plain scripts (plain_horovod.py, plain_mwms.py, keras_synthetic_benchmark.py)
share, written as a Keras user writes it: their flags, and the network, a
keras.applications name or mnist_cnn."""
import argparse


def parser(doc):
    """The flags every plain script takes: the network and its input, the batch, the timing."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--model", default="ResNet50", help="a keras.applications name, or mnist_cnn")
    p.add_argument("--image-shape", default="32x32x3", help="HxWxC")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--steps", type=int, default=30, help="steps in all, the warm-up included")
    p.add_argument("--warmup-steps", type=int, default=3, help="not timed")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=1, help="TF's intra- and inter-op threads")
    p.add_argument("--input", choices=("constant", "tf.data"), default="constant",
                   help="constant: one random batch, again and again, as Horovod's synthetic benchmarks feed "
                        "it; tf.data: random images read as TF's tf.data guide reads data (shuffled, batched, "
                        "scaled, prefetched)")
    return p


def batches(args, shape, seed, samples=4096):
    """next_batch() for the script's steps: (images, labels) of args.batch_size.
    tf.data: `samples` random uint8 images in memory, each worker its own, read
    endlessly through tf.data as TF's guide writes an input pipeline; the
    dataset too (a strategy distributes it)."""
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(seed)
    if args.input == "constant":
        batch = (tf.constant(rng.random((args.batch_size, *shape), np.float32)),
                 tf.constant(rng.integers(0, args.classes, args.batch_size)))
        return lambda: batch, None
    images = rng.integers(0, 256, (samples, *shape), np.uint8)
    labels = rng.integers(0, args.classes, samples)
    dataset = (tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(samples)
               .batch(args.batch_size).map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y),
                                           num_parallel_calls=tf.data.AUTOTUNE)
               .prefetch(tf.data.AUTOTUNE))
    it = iter(dataset)
    return lambda: next(it), dataset


def build(name, shape, classes):
    import keras
    if name == "mnist_cnn":  # the conv net of Horovod's TF2 MNIST example
        layers = keras.layers
        return keras.Sequential([keras.Input(shape), layers.Conv2D(32, 3, activation="relu"),
                                 layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(), layers.Dropout(0.25),
                                 layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dropout(0.5),
                                 layers.Dense(classes)])
    return getattr(keras.applications, name)(weights=None, input_shape=shape, classes=classes,
                                             classifier_activation=None)


def timed_steps(step, args):
    """Run step() args.steps times; the seconds of each after the warm-up."""
    import time
    seconds = []
    for number in range(args.steps):
        start = time.perf_counter()
        step()
        if number >= args.warmup_steps:
            seconds.append(time.perf_counter() - start)
    return seconds


def print_result(step_seconds, seconds_per_rank, size, args):
    """The one JSON line, with images/s measured as ringtrain measures it: every
    rank's timed samples over the slowest rank's timed seconds (not rank 0's
    rate times N). Rank 0 calls it, with every rank's timed seconds."""
    import json
    import os
    import statistics
    samples = size * args.batch_size * len(step_seconds)
    print(json.dumps({"images_per_sec": samples / max(seconds_per_rank), "world_size": size,
                      "timed_samples": samples, "timed_seconds": max(seconds_per_rank),
                      "images_per_sec_per_worker": [samples / size / s for s in seconds_per_rank],
                      "step_time_p50_sec": float(statistics.median(step_seconds)), "input": args.input,
                      "mpi_settings": {k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA_")}}),
          flush=True)
