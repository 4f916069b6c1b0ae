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


# --- images and TFRecords, written without TensorFlow (small ones, for the checks) ----------

def png(image):
    """A uint8 HxWxC image (C 1 or 3) as PNG bytes."""
    import struct
    import zlib
    height, width, channels = image.shape
    raw = b"".join(b"\x00" + image[y].tobytes() for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, 8, {1: 0, 3: 2}[channels], 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def _varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number, payload):
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(features):
    """A serialized tf.train.Example: {key: bytes (a BytesList) or int (an Int64List)}."""
    entries = b""
    for key, value in features.items():
        feature = _field(1, _field(1, value)) if isinstance(value, bytes) else _field(3, _field(1, _varint(value)))
        entries += _field(1, _field(1, key.encode()) + _field(2, feature))
    return _field(1, entries)


def write_tfrecord(path, records):
    """TFRecord framing: length, its masked CRC-32C, the data, its masked CRC-32C."""
    import struct
    from ringtrain.workloads.tfrecords import masked_crc
    with open(path, "wb") as f:
        for data in records:
            header = struct.pack("<Q", len(data))
            f.write(header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data)))
    return path


def digit_records(images, labels, image_key="image/encoded", label_key="image/class/label"):
    return [example({image_key: png(image), label_key: int(label)}) for image, label in zip(images, labels)]


def write_images(root, images, labels, names):
    """ROOT/NAME/i.png for each image, in its label's class folder."""
    for name in names:
        os.makedirs(os.path.join(root, name), exist_ok=True)
    for i, (image, label) in enumerate(zip(images, labels)):
        with open(os.path.join(root, names[label], f"{i:04d}.png"), "wb") as f:
            f.write(png(image))
    return root
