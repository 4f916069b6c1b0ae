"""Shared data: standard formats, the embedded default, and exact sharding."""
import os

import numpy as np
import pytest

from datafiles import write_cifar10, write_mnist_idx, write_mnist_npz
from ringtrain.workloads import data
from ringtrain.common.errors import UsageError
from ringtrain.workloads.sharding import epoch_shard, steps_per_epoch


@pytest.mark.parametrize("n,size,batch", [(4000, 2, 32), (101, 2, 8), (10, 3, 4), (7, 4, 1),
                                          (5, 1, 2), (3, 4, 2)])
def test_every_sample_is_seen_exactly_once_per_epoch_across_ranks(n, size, batch):
    shards = [epoch_shard(n, r, size, batch, seed=3, epoch=1) for r in range(size)]
    seen = np.concatenate([s.indices[s.weights == 1] for s in shards])
    assert sorted(seen.tolist()) == list(range(n))
    # Every rank runs the same number of steps, or collectives would hang.
    assert {s.steps for s in shards} == {steps_per_epoch(n, size, batch)}
    assert {len(s.indices) for s in shards} == {len(shards[0].indices)}
    # Each step's global count is the real samples of that global batch.
    for step in range(shards[0].steps):
        part = slice(step * batch, (step + 1) * batch)
        assert shards[0].global_counts[step] == sum(s.weights[part].sum() for s in shards)


def test_shards_are_disjoint_and_deterministic_by_seed_and_epoch():
    a = [epoch_shard(1000, r, 2, 10, seed=1, epoch=0).indices for r in range(2)]
    assert not set(a[0]) & set(a[1])
    np.testing.assert_array_equal(a[0], epoch_shard(1000, 0, 2, 10, seed=1, epoch=0).indices)
    assert not np.array_equal(a[0], epoch_shard(1000, 0, 2, 10, seed=2, epoch=0).indices)
    assert not np.array_equal(a[0], epoch_shard(1000, 0, 2, 10, seed=1, epoch=1).indices)


def test_global_batches_do_not_depend_on_the_rank_count():
    """What N ranks x b see at step i is what 1 rank x N*b sees: equivalence rests on it."""
    one = epoch_shard(64, 0, 1, 16, seed=5, epoch=0).indices
    two = [epoch_shard(64, r, 2, 8, seed=5, epoch=0).indices for r in range(2)]
    for step in range(4):
        joint = np.concatenate([t[step * 8:(step + 1) * 8] for t in two])
        assert sorted(joint) == sorted(one[step * 16:(step + 1) * 16])


def test_embedded_mnist_is_real_and_split_deterministically():
    ds = data.load("mnist")
    assert ds.train_images.shape == (4000, 28, 28, 1) and ds.test_images.shape == (1000, 28, 28, 1)
    assert np.bincount(ds.test_labels).tolist() == [100] * 10
    assert ds.train_images.max() == 255 and ds.train_images.dtype == np.uint8
    np.testing.assert_array_equal(ds.test_images, data.load("mnist").test_images)


@pytest.mark.parametrize("gz", [True, False])
def test_full_mnist_reads_idx_files(tmp_path, gz):
    ds = data.load("mnist", write_mnist_idx(str(tmp_path), 101, 51, gz=gz))
    assert ds.train_images.shape == (101, 28, 28, 1) and len(ds.test_labels) == 51


def test_full_mnist_reads_keras_npz(tmp_path):
    ds = data.load("mnist", write_mnist_npz(str(tmp_path), 64, 32))
    assert ds.train_images.shape == (64, 28, 28, 1) and ds.test_labels.shape == (32,)


def test_cifar10_reads_python_batches(tmp_path):
    ds = data.load("cifar10", write_cifar10(str(tmp_path), per_batch=20, n_test=10))
    assert ds.train_images.shape == (100, 32, 32, 3) and ds.test_images.shape == (10, 32, 32, 3)


def test_truncated_idx_names_the_file(tmp_path):
    folder = write_mnist_idx(str(tmp_path), gz=False)
    path = os.path.join(folder, "train-images-idx3-ubyte")
    with open(path, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(UsageError, match="train-images-idx3-ubyte is truncated"):
        data.load("mnist", folder)


def test_corrupt_gzip_idx_names_the_file(tmp_path):
    folder = write_mnist_idx(str(tmp_path), gz=True)
    path = os.path.join(folder, "t10k-labels-idx1-ubyte.gz")
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b garbage")
    with pytest.raises(UsageError, match="t10k-labels-idx1-ubyte.gz"):
        data.load("mnist", folder)


def test_corrupt_cifar_batch_names_the_file(tmp_path):
    folder = write_cifar10(str(tmp_path))
    with open(os.path.join(folder, "cifar-10-batches-py", "data_batch_3"), "wb") as f:
        f.write(b"not a pickle")
    with pytest.raises(UsageError, match="data_batch_3"):
        data.load("cifar10", folder)
