"""Deterministic per-epoch sharding: each rank gets a disjoint shard, every
sample is seen exactly once per epoch across ranks, and every rank runs the
same number of steps (collectives need that, or the job hangs).

When the sample count does not divide by the rank count, the shorter shards
are padded with weight-0 entries. Each step also carries the real sample count
of the whole global batch, so the loss can be normalised by it and the
averaged gradient equals that of one process on the global batch.
"""
import math
from dataclasses import dataclass

import numpy as np


@dataclass
class EpochShard:
    indices: np.ndarray        # (padded_len,) sample indices for this rank
    weights: np.ndarray        # (padded_len,) 1.0 for real samples, 0.0 for padding
    global_counts: np.ndarray  # (steps,) real samples in each global batch

    @property
    def steps(self):
        return len(self.global_counts)


def steps_per_epoch(num_samples, size, batch_size):
    return math.ceil(math.ceil(num_samples / size) / batch_size)


def epoch_shard(num_samples, rank, size, batch_size, seed, epoch):
    """Rank `rank`'s share of epoch `epoch`: a seeded permutation dealt round-robin."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside 0..{size - 1}")
    per_rank = math.ceil(num_samples / size)
    order = np.full(per_rank * size, -1, dtype=np.int64)
    order[:num_samples] = np.random.default_rng([seed, epoch]).permutation(num_samples)
    # Row i holds the i-th sample of every rank, so column r is rank r's shard.
    table = order.reshape(per_rank, size)
    real = table >= 0
    step_of_row = np.arange(per_rank) // batch_size
    global_counts = np.bincount(step_of_row, weights=real.sum(axis=1)).astype(np.float32)
    column = table[:, rank]
    return EpochShard(indices=np.where(column >= 0, column, 0),
                      weights=real[:, rank].astype(np.float32),
                      global_counts=global_counts)


def eval_shard(num_samples, rank, size):
    """Test samples for this rank: disjoint, unpadded (evaluation sums counts)."""
    return np.arange(rank, num_samples, size)


# --- every source, every mode: what one worker reads of one epoch --------------------------
#
# The rule above, for every source. Each epoch has one order of its records,
# seeded by (--seed, epoch): a permutation where any record can be read by its
# number (arrays, image folders); where records are read in order (TFRecord
# files, a factory's dataset), the files in a seeded order and the records
# through a seeded shuffle buffer. By record, worker r reads positions r, r+N,
# r+2N... of that order, so N workers x batch b read the global batches that
# one process reads at batch N*b. By file (TFRecords, enough files), each
# worker reads the records of its own files, dealt once so that the workers'
# shares are as even as can be, in the epoch's order. Either way an update is
# K micro-batches (--accumulate K) of b, each worker runs every update (the
# short shares end in weight-0 padding), and a resume skips exactly the updates
# done.

@dataclass
class EpochPlan:
    """What one worker reads of one epoch, from a position on, and how its updates are made of it."""
    update_counts: np.ndarray  # real samples of each update, over every worker
    real: int                  # real records this worker reads
    padding: int               # weight-0 entries after them
    ids: np.ndarray = None     # random access: the records it reads, in order
    files: tuple = ()          # a stream: the files, in this epoch's order
    shuffle_seed: int = 0      # a stream: its shuffle buffer's seed
    shard: tuple = (0, 1)      # a stream: it keeps positions index, index + count, ... of it
    skip: int = 0              # a stream: records of its share skipped first (a resume)

    @property
    def updates(self):
        return len(self.update_counts)


def updates_per_epoch(source, size, batch_size, accumulate=1):
    """Updates of one epoch (K micro-batches of b each, on every worker)."""
    if source.sharding(size) == "file":
        micro = max(math.ceil(c / batch_size) for c in _file_shares(source.train, size))
    else:
        micro = steps_per_epoch(source.train.count, size, batch_size)
    return math.ceil(micro / accumulate)


def epoch_plan(source, rank, size, batch_size, accumulate, seed, epoch, skip_updates=0):
    """Worker `rank` of `size`'s EpochPlan of `epoch`, after `skip_updates` updates of it."""
    b, k, train = batch_size, accumulate, source.train
    if source.sharding(size) == "file":
        shares, files = _file_shares(train, size), _files_of(train, size, rank, seed, epoch)
        micro = max(math.ceil(c / b) for c in shares)
        counts = np.array([sum(min(max(c - j * b, 0), b) for c in shares) for j in range(micro)], np.float32)
        mine, shuffle, shard = shares[rank], _seed(seed, epoch, rank), (0, 1)
    else:
        layout = epoch_shard(train.count, rank, size, b, seed, epoch)
        counts, mine = layout.global_counts, int(layout.weights.sum())
        files = tuple(train.files[i] for i in _order(len(train.files), seed, epoch)) if not train.random_access \
            else ()
        shuffle, shard = _seed(seed, epoch), (rank, size)
    updates = math.ceil(len(counts) / k)
    grouped = np.zeros(updates * k, np.float32)
    grouped[:len(counts)] = counts
    start = min(skip_updates * k * b, updates * k * b)
    real = max(mine - start, 0)
    plan = EpochPlan(grouped.reshape(updates, k).sum(axis=1)[skip_updates:], real,
                     updates * k * b - start - real, files=files, shuffle_seed=shuffle, shard=shard, skip=start)
    if train.random_access:
        plan.ids = layout.indices[start:start + real]
    return plan


def _order(count, seed, epoch):
    return np.random.default_rng([seed, epoch]).permutation(count)


def _seed(seed, epoch, *more):
    return int(np.random.default_rng([seed, epoch, *more, 1]).integers(2 ** 31))


def deal_files(counts, size):
    """Which worker reads each file: the largest first, each to the worker with
    the fewest records so far (the lowest rank on a tie): as even as can be, the
    same every epoch."""
    owner, load = [0] * len(counts), [0] * size
    for f in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        owner[f] = min(range(size), key=lambda r: (load[r], r))
        load[owner[f]] += counts[f]
    return owner


def _file_shares(split, size):
    owner, shares = deal_files(split.counts, size), [0] * size
    for f, count in enumerate(split.counts):
        shares[owner[f]] += count
    return shares


def _files_of(split, size, rank, seed, epoch):
    owner = deal_files(split.counts, size)
    return tuple(split.files[f] for f in _order(len(split.files), seed, epoch) if owner[f] == rank)
