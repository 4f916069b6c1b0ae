"""Shared data: standard formats, the embedded default, TFRecords and image
folders read and checked without TensorFlow, and the one sharding rule: by
record and by file, K micro-batches per update, a resume."""
import os

import numpy as np
import pytest

from datafiles import (digit_records, example, png, write_cifar10, write_images, write_mnist_idx, write_mnist_npz,
                       write_tfrecord)
from ringtrain.workloads import data, sources
from ringtrain.common.errors import UsageError
from ringtrain.workloads.sharding import epoch_plan, epoch_shard, steps_per_epoch, updates_per_epoch


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


# --- every source: TFRecords, image folders, a factory -------------------------------------

def digits(n, seed=0):
    """n of the embedded MNIST digits, in a random order: (images, labels)."""
    mnist = data.load("mnist")
    pick = np.random.default_rng(seed).permutation(len(mnist.train_labels))[:n]
    return mnist.train_images[pick], mnist.train_labels[pick]


def record_files(folder, images, labels, files=2, prefix="train", **keys):
    os.makedirs(folder, exist_ok=True)
    records = digit_records(images, labels, **keys)
    for f, chunk in enumerate(np.array_split(np.arange(len(records)), files)):
        write_tfrecord(os.path.join(folder, f"{prefix}-{f}"), [records[i] for i in chunk])
    return os.path.join(folder, f"{prefix}-*")


def opened(data_, model_classes=10, **request):
    return sources.open_source(sources.Request(data_, **request), (28, 28, 1), model_classes, "mnist_mlp")


def test_tfrecords_are_counted_labelled_and_split_without_tensorflow(tmp_path):
    images, labels = digits(30)
    train = record_files(str(tmp_path), images, labels, files=3)
    record_files(str(tmp_path), images[:10], labels[:10], files=1, prefix="validation")
    source = opened(train)
    assert (source.train.count, source.test.count, len(source.train.files)) == (30, 10, 3)
    assert source.num_classes == labels.max() + 1
    assert source.sharding(2) == "file" and source.sharding(4) == "record"  # as tf.data's AUTO policy
    assert "sharded by file (3 files)" in source.describe(2)


def test_a_record_without_the_feature_keys_names_them_and_the_flags(tmp_path):
    images, labels = digits(4)
    glob_ = record_files(str(tmp_path), images, labels, image_key="img", label_key="digit")
    with pytest.raises(UsageError, match=r"has no feature 'image/encoded' \(its features: digit, img\): give "
                                         "--image-key and --label-key"):
        opened(glob_)
    assert opened(glob_, image_key="img", label_key="digit").train.count == 4


def test_a_file_that_is_not_a_tfrecord_is_named(tmp_path):
    (tmp_path / "train-0").write_bytes(os.urandom(64))
    with pytest.raises(UsageError, match="train-0 is not a TFRecord file"):
        opened(str(tmp_path / "train-*"))


def test_an_image_that_does_not_decode_is_named_or_left_out_and_counted(tmp_path):
    images, labels = digits(6)
    records = digit_records(images, labels)
    records[4] = example({"image/encoded": png(images[4])[:-20], "image/class/label": int(labels[4])})  # cut short
    write_tfrecord(str(tmp_path / "train-0"), records)
    with pytest.raises(UsageError, match=r"train-0: the image of record 4 does not decode: a PNG cut short .*"
                                         "--skip-bad-images"):
        opened(str(tmp_path / "train-*"))
    source = opened(str(tmp_path / "train-*"), skip_bad_images=True)
    assert source.train.count == 5 and len(source.skipped) == 1 and "record 4" in source.skipped[0][0]


def test_a_label_outside_the_models_classes_is_named_with_its_file(tmp_path):
    images, labels = digits(5)
    labels = labels.copy()
    labels[3] = 12
    glob_ = record_files(str(tmp_path), images, labels, files=1)
    with pytest.raises(UsageError, match=r"label 12 \(in .*train-0, record 3 of those read\) is outside "
                                         r"mnist_mlp's 10 classes \(0..9\)"):
        opened(glob_)
    assert opened(glob_, model_classes=None).num_classes == 13  # a model of your own is built for 13


def test_image_folders_take_their_classes_from_the_sub_folders_and_the_test_split_beside(tmp_path):
    images, labels = digits(30)
    labels = np.arange(30) % 3
    write_images(str(tmp_path / "train"), images[:24], labels[:24], ["cat", "dog", "owl"])
    write_images(str(tmp_path / "test"), images[24:], labels[24:], ["cat", "dog", "owl"])
    source = opened(str(tmp_path / "train"))
    assert source.num_classes == 3 and source.train.count == 24 and source.test.count == 6
    assert source.train.class_names == ["cat", "dog", "owl"]
    names = [os.path.basename(os.path.dirname(p)) for p in source.train.paths]
    assert [source.train.class_names[label] for label in source.train.labels] == names


def test_an_empty_class_folder_and_a_bad_image_are_named(tmp_path):
    images, labels = digits(4)
    write_images(str(tmp_path / "data"), images, labels % 2, ["a", "b"])
    (tmp_path / "data" / "c").mkdir()
    with pytest.raises(UsageError, match="class folder .*data/c holds no images"):
        opened(str(tmp_path / "data"))
    (tmp_path / "data" / "c" / "x.jpg").write_bytes(b"<html>not found</html>")
    with pytest.raises(UsageError, match=r"data/c/x.jpg does not decode: not a JPEG, PNG, GIF or BMP image: "
                                         "replace or remove it, or pass --skip-bad-images"):
        opened(str(tmp_path / "data"))


def fake_records(counts):
    return sources.Source("tfrecord", "fake", (28, 28, 1), 10, sources.RecordSplit(
        tuple(f"f{i}" for i in range(len(counts))), tuple(counts), {}))


@pytest.mark.parametrize("size,batch,accumulate", [(2, 4, 1), (3, 2, 2), (2, 3, 3)])
def test_by_file_every_file_is_dealt_once_and_every_worker_runs_every_update(size, batch, accumulate):
    source = fake_records([10, 3, 7, 7, 0, 12, 5])
    plans = [epoch_plan(source, r, size, batch, accumulate, seed=1, epoch=2) for r in range(size)]
    files = [f for p in plans for f in p.files]
    assert sorted(files) == sorted(source.train.files)  # each file once, to one worker
    assert sum(p.real for p in plans) == 44 and all(p.shard == (0, 1) for p in plans)
    updates = updates_per_epoch(source, size, batch, accumulate)
    for p in plans:
        assert p.updates == updates and p.real + p.padding == updates * accumulate * batch
        np.testing.assert_array_equal(p.update_counts, plans[0].update_counts)
    assert plans[0].update_counts.sum() == 44 and plans[0].update_counts.min() > 0
    assert [p.files for p in plans] != [epoch_plan(source, r, size, batch, accumulate, 1, 3).files
                                        for r in range(size)]  # a new order each epoch


def test_by_record_n_workers_with_k_micro_batches_make_the_updates_of_one_process_on_the_global_batch():
    source = fake_records([20, 17])
    source.shard_by = "record"  # (auto: one process would read 2 files by file)
    one = epoch_plan(source, 0, 1, 24, 1, seed=3, epoch=0)
    many = [epoch_plan(source, r, 3, 4, 2, seed=3, epoch=0) for r in range(3)]
    np.testing.assert_array_equal(one.update_counts, many[0].update_counts)
    assert one.files == many[0].files and one.shuffle_seed == many[0].shuffle_seed  # one order of the epoch
    assert [p.shard for p in many] == [(0, 3), (1, 3), (2, 3)] and sum(p.real for p in many) == 37


@pytest.mark.parametrize("random_access", [True, False])
def test_a_resume_skips_exactly_the_updates_done(random_access):
    source = data_source_of(random_access)
    whole = epoch_plan(source, 1, 2, 4, 2, seed=0, epoch=1)
    resumed = epoch_plan(source, 1, 2, 4, 2, seed=0, epoch=1, skip_updates=3)
    np.testing.assert_array_equal(resumed.update_counts, whole.update_counts[3:])
    assert resumed.real + resumed.padding == whole.real + whole.padding - 3 * 2 * 4
    if random_access:
        np.testing.assert_array_equal(resumed.ids, whole.ids[3 * 2 * 4:])
    else:
        assert resumed.skip == 3 * 2 * 4 and resumed.files == whole.files


def data_source_of(random_access):
    if not random_access:
        return fake_records([30, 21])
    images, labels = np.zeros((51, 28, 28, 1), np.uint8), np.arange(51) % 10
    return sources.Source("mnist", "x", (28, 28, 1), 10, sources.ArraySplit(images, labels))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tfrecord", "folder"])
def test_through_the_pipeline_workers_read_disjoint_shares_and_together_one_processs_updates(tmp_path, kind):
    """The tf.data pipeline itself (decoding, the seeded shuffle buffer, the
    shard): 2 workers x 2 micro-batches of 2 read, update by update, the very
    images one process reads at batch 8; by file, each a share of its own; a
    resumed worker reads the rest of its share."""
    import tensorflow as tf
    from ringtrain.workloads.pipeline import epoch_dataset
    images, labels = digits(37)
    where = record_files(str(tmp_path), images, labels) if kind == "tfrecord" else \
        write_images(str(tmp_path / "train"), images, np.arange(37) % 10, [f"d{i}" for i in range(10)])
    source = opened(where, shard_by="record", shuffle_buffer=8)
    every = {np.asarray(image, np.float32).tobytes() for image in images / np.float32(255.0)}

    def updates(rank, size, batch, accumulate, skip=0):
        plan = epoch_plan(source, rank, size, batch, accumulate, seed=1, epoch=0, skip_updates=skip)
        return [({x.tobytes() for x in batch_images.numpy()[weights.numpy() > 0]}, float(count))
                for batch_images, _, weights, count in epoch_dataset(tf, source, plan, batch, accumulate)]

    one, two = updates(0, 1, 8, 1), [updates(r, 2, 2, 2) for r in range(2)]
    assert len(one) == len(two[0]) == len(two[1]) == 5
    for (mine, count), (first, count_0), (second, _) in zip(one, *two):
        assert first | second == mine and not first & second and count == count_0 == len(mine)
    assert set().union(*(m for m, _ in one)) == every
    assert updates(1, 2, 2, 2, skip=2) == two[1][2:]
    if kind == "tfrecord":
        source.shard_by = "file"
        shares = [set().union(*(m for m, _ in updates(r, 2, 4, 1))) for r in range(2)]
        assert not shares[0] & shares[1] and shares[0] | shares[1] == every


@pytest.mark.slow
def test_a_graph_mode_iterator_closes_its_session_when_dropped_not_when_it_runs_out():
    """Closing a TF1 session waits for tf.data's threads (seconds, at an epoch's end, with
    processes sharing the cores): the graph-mode PS's epoch iterator keeps its session open
    when it runs out, so that the helper thread that drops it is the one that closes it."""
    import sys
    from helpers import run
    script = """if True:
        import weakref
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        from ringtrain.workloads.pipeline import numpy_iterator
        iterator = numpy_iterator(lambda tf: tf.data.Dataset.range(3), threads=1)
        assert [int(e) for e in iterator] == [0, 1, 2] and list(iterator) == []
        assert not iterator.session._closed, "closed as it ran out"
        session = weakref.ref(iterator.session)
        del iterator
        assert session() is None, "its session outlived it"
        print("closed when dropped")"""
    done = run([sys.executable, "-c", script], timeout=120)
    assert done.returncode == 0 and "closed when dropped" in done.stdout, done.stdout + done.stderr


def test_each_epochs_iterator_is_opened_ahead_and_dropped_on_the_helper_thread():
    """The training thread never makes or deletes an epoch's iterator (both stalled it
    for seconds at an epoch's end, ranks sharing the cores): the helper does both. When
    training ends, the epoch being read and the one being opened are dropped there too,
    and the training thread does not wait for the opening."""
    import itertools
    import threading
    from ringtrain.workloads import pipeline
    where = {"opened": [], "dropped": []}
    opening, release, order = threading.Event(), threading.Event(), []

    class Epoch:
        def __init__(self, plan):
            if plan == "f":  # (the epoch after the last one read: still opening when training ends)
                opening.set()
                release.wait(30)
                order.append("opened after the end")
            where["opened"].append(threading.current_thread().name)
            self.items = iter(plan)

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.items)

        def __del__(self):
            where["dropped"].append(threading.current_thread().name)

    updates = pipeline._opened_ahead(iter([(0, 0, "ab"), (1, 1, "c"), (2, 0, "de"), (3, 0, "f")]), Epoch)
    assert list(itertools.islice(updates, 4)) == [(0, 1, "a"), (0, 2, "b"), (1, 2, "c"), (2, 1, "d")]
    assert opening.wait(30)
    updates.close()  # training ends
    order.append("training ended")
    release.set()
    for thread in threading.enumerate():
        if thread.name.startswith("epoch-iterators"):
            thread.join(30)
    assert order == ["training ended", "opened after the end"]
    assert len(where["opened"]) == 4 and all(name.startswith("epoch-iterators") for name in where["opened"])
    assert where["dropped"] == [where["opened"][0]] * 4  # epochs 0 and 1 spent, 2 being read, 3 opened
