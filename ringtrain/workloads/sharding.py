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
