"""`--snapshot-every K --snapshot-dir DIR`: the weights every K steps, with
the training seconds and the samples seen, for evaluating afterwards
(`ringtrain-bench convergence`).

Evaluating during training would stall a synchronous job, or only the chief
of an async one, and so change what is measured. A snapshot is a copy of the
weights instead, and the seconds it took are taken off the training clock.
Files: DIR/index.jsonl (one JSON line per snapshot) and DIR/step-NNNNNNN.npz
(the weights by variable name, without TF's ":0").
"""
import json
import os
import time

import numpy as np

INDEX = "index.jsonl"


class Snapshots:
    def __init__(self, folder, every):
        self.folder, self.every = folder, every
        self.overhead = 0.0  # seconds spent taking snapshots: not training time
        self.start = time.perf_counter()
        if folder:
            os.makedirs(folder, exist_ok=True)  # checked at start-up
            open(os.path.join(folder, INDEX), "w").close()

    def start_clock(self):
        self.start, self.overhead = time.perf_counter(), 0.0

    def due(self, step):
        return bool(self.folder) and step % self.every == 0

    def take(self, step, samples_seen, read_weights, **fields):
        """read_weights() -> [(variable name, numpy value)]; `fields` go into the index line."""
        began = time.perf_counter()
        training_seconds = began - self.start - self.overhead
        name = f"step-{step:07d}.npz"
        np.savez(os.path.join(self.folder, name), **dict(read_weights()))
        with open(os.path.join(self.folder, INDEX), "a") as f:
            f.write(json.dumps({"step": int(step), "samples_seen": int(samples_seen),
                                "training_seconds": training_seconds, "unix_time": time.time(),
                                "snapshot_seconds_so_far": self.overhead, "file": name, **fields}) + "\n")
        self.overhead += time.perf_counter() - began


def read(folder):
    """The index's records, oldest first."""
    with open(os.path.join(folder, INDEX)) as f:
        return [json.loads(line) for line in f if line.strip()]


def load(folder, record):
    """{variable name: numpy value} of one snapshot."""
    with np.load(os.path.join(folder, record["file"])) as f:
        return {k: f[k] for k in f.files}
