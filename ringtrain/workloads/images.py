"""Encoded images checked without decoding them (the first and last bytes:
what the format starts with, and that it is whole), and folders of class
folders listed, as keras.utils.image_dataset_from_directory reads them: each
sub-folder a class, its name the class's, in sorted order. Numpy and the
standard library only: bad input is one line before TensorFlow loads."""
import os

import numpy as np

from ringtrain.common.errors import UsageError
from ringtrain.workloads.cache import cached

# what tf.io.decode_image reads (keras' image_dataset_from_directory takes the same)
EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
TAIL = 1024  # bytes read from an image's end, where its end marker is


def check(head, tail, size):
    """None where the bytes look like a whole JPEG, PNG, GIF or BMP; else why not."""
    if size == 0:
        return "it is empty"
    if head.startswith(b"\xff\xd8\xff"):
        return None if b"\xff\xd9" in tail else "a JPEG cut short (no end-of-image marker)"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return None if b"IEND" in tail[-16:] else "a PNG cut short (no IEND chunk)"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return None if tail.rstrip(b"\0").endswith(b";") else "a GIF cut short (no trailer)"
    if head.startswith(b"BM") and len(head) >= 6:
        return None if int.from_bytes(head[2:6], "little") <= size else "a BMP cut short"
    return "not a JPEG, PNG, GIF or BMP image"


def check_file(path):
    try:
        with open(path, "rb") as f:
            head, size = f.read(16), os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TAIL))
            return check(head, f.read(), size)
    except OSError as e:
        return f"it cannot be read ({e.strerror})"


def class_names(root, flag="--data"):
    """The class folders of `root`, sorted: each a class, in that order."""
    try:
        names = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise UsageError(f"{flag} {root}: cannot read the folder ({e.strerror})") from None
    if not names:
        raise UsageError(f"{flag} {root} has no class folders: give a folder with one sub-folder of images per "
                         "class (ROOT/cat/1.jpg, ROOT/dog/2.png, ...)")
    return names


def list_folder(root, classes, skip_bad=False, flag="--data"):
    """(paths, labels, [(path, why)] dropped) of every image of root's class
    folders; `classes`: the class names, in label order (the training split's)."""
    paths, labels, dropped = [], [], []
    for name in class_names(root, flag):
        if name not in classes:
            raise UsageError(f"{flag} {root}: class folder {name!r} is not one of the training data's classes "
                             f"({', '.join(classes[:5])}{', ...' if len(classes) > 5 else ''}): give both splits "
                             "the same class folders")
        folder = os.path.join(root, name)
        files = sorted(e.path for e in os.scandir(folder)
                       if e.is_file() and e.name.lower().endswith(EXTENSIONS) and not e.name.startswith("."))
        if not files:
            raise UsageError(f"{flag} {root}: class folder {folder} holds no images ({', '.join(EXTENSIONS)}): "
                             "add its images or remove the folder")
        for path, why in zip(files, _checked(files)):
            if why is None:
                paths.append(path)
                labels.append(classes.index(name))
            elif skip_bad:
                dropped.append((path, why))
            else:
                raise UsageError(f"{path} does not decode: {why}: replace or remove it, or pass --skip-bad-images")
    return np.asarray(paths), np.asarray(labels, np.int32), dropped


def _checked(files):
    """Each file's check_file, cached by the files' names, sizes and times."""
    stats = [(os.path.basename(p), *_size_and_time(p)) for p in files]
    key = ("folder", os.path.dirname(os.path.abspath(files[0])), stats, 1)
    return cached(key, lambda: {"why": [check_file(p) for p in files]})["why"]


def _size_and_time(path):
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns
