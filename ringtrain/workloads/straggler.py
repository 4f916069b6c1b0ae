"""`--straggler RANK:FACTOR[:EVERY]`: one worker made slower, as if its host
were, so that what a slow worker costs each mode can be measured.

The straggler waits after its own compute: a step that took t seconds is
followed by (FACTOR - 1) * t more, so each of its steps takes FACTOR times its
compute time. With EVERY, only every EVERY-th step of its own is slow
(transient stalls). Where a process runs its own loop (ring ranks, the v1
PS workers) the wait is a sleep after the step (`Slowdown`); where one graph
runs a worker's step remotely (TF2 PS, in-graph towers, towers in one
process) it is a wait inside that worker's part of the graph (`wait_after`).

Numpy only at import: the flag is parsed before TensorFlow loads.
"""
import argparse
import math
import time
from dataclasses import dataclass

from ringtrain.common.errors import UsageError


@dataclass(frozen=True)
class Straggler:
    rank: int
    factor: float
    every: int = 1

    def extra(self, rank, step):
        """How many times its compute worker `rank` waits after its own
        `step` (counted from 1): FACTOR - 1 on a slow step, else 0."""
        return self.factor - 1.0 if rank == self.rank and step % self.every == 0 else 0.0

    def __str__(self):
        return f"{self.rank}:{self.factor:g}" + (f":{self.every}" if self.every != 1 else "")


def parse(text):
    """argparse type for RANK:FACTOR[:EVERY]."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        rank, factor = int(parts[0]), float(parts[1])
        every = int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK:FACTOR or RANK:FACTOR:EVERY, like 1:3 or 1:3:10, "
                                         f"got {text!r}") from None
    if rank < 0 or not math.isfinite(factor) or factor < 1 or every < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: RANK >= 0, FACTOR >= 1 (finite), EVERY >= 1")
    return Straggler(rank, factor, every)


def check(spec, workers, what="rank"):
    """One line if the straggler is not one of the `workers` ranks/workers."""
    if spec is not None and spec.rank >= workers:
        raise UsageError(f"--straggler {spec}: there is no {what} {spec.rank} among {workers} "
                         f"(use 0..{workers - 1})")


def summary_fields(spec, waited):
    """The summary's record of the injected slowness: the spec, and each
    worker's seconds of injected waiting (None where a mode cannot see it)."""
    if spec is None:
        return {}
    return {"straggler": {"rank": spec.rank, "factor": spec.factor, "every": spec.every,
                          "waited_sec": waited}}


class Slowdown:
    """The straggler's wait, for a process that runs its own training loop:

        with slowdown.step(step):
            ...one training step...
    """

    def __init__(self, spec, rank):
        self.spec, self.rank = spec, rank
        self.waited = 0.0  # seconds of injected waiting so far

    def step(self, step):
        return _TimedStep(self, step)

    def after(self, step, compute_seconds):
        extra = self.spec.extra(self.rank, step) if self.spec else 0.0
        if extra > 0:
            time.sleep(extra * compute_seconds)
            self.waited += extra * compute_seconds


class _TimedStep:
    def __init__(self, slowdown, step):
        self.slowdown, self.number = slowdown, step

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.slowdown.after(self.number, time.perf_counter() - self.start)
        return False


def wait_after(tf, values, started, extra):
    """The straggler's wait inside a graph: `values` (a list of tensors) held
    back until `extra` times (now - `started`) more seconds have passed once
    they are ready. `started` is a tf.timestamp() that the compute depends on;
    `extra` a float tensor (0: no wait). Returns (the values, the seconds
    waited). The wait uses no CPU and runs on the caller's device scope."""
    from ringtrain.workloads.simulated import wait
    with tf.control_dependencies(values):
        seconds = (tf.timestamp() - started) * tf.cast(extra, tf.float64)
    waited = wait(seconds, seconds)
    with tf.control_dependencies([waited]):
        return [tf.identity(v) for v in values], tf.identity(waited)
