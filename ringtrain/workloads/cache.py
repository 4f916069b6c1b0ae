"""What the data's checks found, kept per file (or folder) so that the next
run, and the other processes on the host, need not read it all again. One
JSON file per key under $RINGTRAIN_DATA_CACHE (default ~/.cache/ringtrain/data);
a key holds what identifies the input (its path, size and modification
time), so that a changed file is read again. Where the folder cannot be
written, nothing is kept."""
import contextlib
import fcntl
import hashlib
import json
import os

import numpy as np


def folder():
    return os.environ.get("RINGTRAIN_DATA_CACHE") or os.path.join(
        os.environ.get("RINGTRAIN_CACHE") or os.path.expanduser("~/.cache/ringtrain"), "data")


def cached(key, compute):
    """compute() (a dict of lists, numbers, strings and numpy arrays), or what
    it returned for `key` before. One process per host computes it at a time."""
    path = os.path.join(folder(), hashlib.sha256(repr(key).encode()).hexdigest() + ".json")
    with _locked(path):
        found = _read(path)
        if found is not None:
            return found
        value = compute()
        _write(path, value)
        return value


@contextlib.contextmanager
def _locked(path):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = open(path + ".lock", "a")
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read(path):
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return None
    return {k: np.asarray(v["array"], v["dtype"]) if isinstance(v, dict) and "array" in v else v
            for k, v in stored.items()}


def _write(path, value):
    stored = {k: {"array": v.tolist(), "dtype": str(v.dtype)} if isinstance(v, np.ndarray) else v
              for k, v in value.items()}
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(stored, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass
