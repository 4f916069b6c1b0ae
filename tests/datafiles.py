"""Small datasets written in their standard on-disk formats."""
import gzip
import os
import pickle

import numpy as np


def write_idx(path, array):
    """IDX: 0x00 0x00 0x08 ndim, big-endian dims, then unsigned bytes."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def write_mnist_idx(folder, n_train=101, n_test=51, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    ext = ".gz" if gz else ""
    for stem, n in (("train", n_train), ("t10k", n_test)):
        write_idx(os.path.join(folder, f"{stem}-images-idx3-ubyte{ext}"),
                  rng.integers(0, 256, (n, 28, 28)))
        write_idx(os.path.join(folder, f"{stem}-labels-idx1-ubyte{ext}"), rng.integers(0, 10, n))
    return folder


def write_mnist_npz(folder, n_train=64, n_test=32, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    np.savez(os.path.join(folder, "mnist.npz"),
             x_train=rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, n_train), x_test=rng.integers(0, 256, (n_test, 28, 28),
                                                                       dtype=np.uint8),
             y_test=rng.integers(0, 10, n_test))
    return folder


def write_cifar10(folder, per_batch=20, n_test=20, seed=0):
    """cifar-10-batches-py: pickled dicts with b'data' (n, 3072) and b'labels'."""
    rng = np.random.default_rng(seed)
    root = os.path.join(folder, "cifar-10-batches-py")
    os.makedirs(root, exist_ok=True)
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        with open(os.path.join(root, name), "wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         b"labels": rng.integers(0, 10, n).tolist()}, f)
    return folder
