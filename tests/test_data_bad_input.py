"""Bad data: one line naming the problem and the fix, a non-zero exit within
seconds, and nothing in the checkpoint folder. (The checks themselves, on
the sources without a launcher: tests/test_data_and_sharding.py.)"""
import os

import numpy as np
import pytest

from datafiles import digit_records, example, png, write_images, write_tfrecord
from helpers import BIN, ENV, REPO, assert_one_line_error, last_json, run_ok

pytestmark = pytest.mark.timeout(120)
RINGTRAIN = os.path.join(BIN, "ringtrain")
EXAMPLES_ENV = dict(ENV, PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(REPO, "examples"),
                                                                   ENV.get("PYTHONPATH")])))


def digits(n):
    from ringtrain.workloads import data
    mnist = data.load("mnist")
    return mnist.train_images[::97][:n], mnist.train_labels[::97][:n]


def refused(tmp_path, args, expected, argv0=RINGTRAIN, **kw):
    """The one line, and nothing written to --checkpoint-dir."""
    ckpt = tmp_path / "ckpt"
    line = assert_one_line_error([argv0, *args, "--model", "mnist_mlp", "--steps", "2", "--checkpoint-dir", str(ckpt)],
                                 expected, **kw)
    assert not ckpt.exists() or not os.listdir(ckpt), os.listdir(ckpt)
    return line


def test_a_glob_that_matches_nothing(tmp_path):
    refused(tmp_path, ["--data", str(tmp_path / "train-*")], f"--data {tmp_path}/train-* matches no file: give a glob")


def test_a_tfrecord_without_the_feature_keys(tmp_path):
    images, labels = digits(4)
    write_tfrecord(str(tmp_path / "train-0"), digit_records(images, labels, image_key="jpeg", label_key="y"))
    refused(tmp_path, ["--data", str(tmp_path / "train-0")], "has no feature 'image/encoded' (its features: jpeg, y): "
                                                              "give --image-key and --label-key")


def folder_with_a_broken_image(tmp_path):
    images, labels = digits(40)
    write_images(str(tmp_path / "train"), images, np.arange(40) % 2, ["even", "odd"])
    bad = tmp_path / "train" / "odd" / "broken.png"
    bad.write_bytes(png(images[0])[:100])
    return bad


def test_an_image_that_does_not_decode_is_named(tmp_path):
    bad = folder_with_a_broken_image(tmp_path)
    refused(tmp_path, ["--data", str(tmp_path / "train")], f"{bad} does not decode: a PNG cut short (no IEND chunk): "
                                                           "replace or remove it, or pass --skip-bad-images")


@pytest.mark.slow
def test_skip_bad_images_leaves_it_out_and_counts_it_in_the_summary(tmp_path):
    bad = folder_with_a_broken_image(tmp_path)
    out = run_ok([RINGTRAIN, "--data", str(tmp_path / "train"), "--skip-bad-images", "--steps", "2",
                  "--model", "mnist_mlp", "--batch-size", "8", "--threads", "1"])
    assert "(40 train, 0 test; 2 classes; read at 28x28x1; sharded by file (an image each); 1 bad image(s) " \
           "left out; no test split (--test-data))" in out
    assert last_json(out)["skipped_images"] == [f"{bad}: a PNG cut short (no IEND chunk)"]


def test_a_label_outside_the_models_classes(tmp_path):
    images, labels = digits(6)
    records = digit_records(images, labels)
    records[2] = example({"image/encoded": png(images[2]), "image/class/label": 10})
    write_tfrecord(str(tmp_path / "train-0"), records)
    refused(tmp_path, ["--data", str(tmp_path / "train-0")],
            "label 10 (in {}, record 2 of those read) is outside mnist_mlp's 10 classes (0..9)".format(
                tmp_path / "train-0"))


def test_an_empty_class_folder(tmp_path):
    images, labels = digits(4)
    write_images(str(tmp_path / "train"), images, np.arange(4) % 2, ["a", "b"])
    (tmp_path / "train" / "c").mkdir()
    refused(tmp_path, ["--data", str(tmp_path / "train")], f"class folder {tmp_path}/train/c holds no images")


@pytest.mark.slow  # (the factory is read once in a process of its own, which imports TensorFlow)
def test_a_factory_that_does_not_return_a_dataset(tmp_path):
    refused(tmp_path, ["--data", "my_data:not_a_dataset"], "--data my_data:not_a_dataset returned a list of int, "
            "int, int: it must return a tf.data.Dataset of (image, label), or a (train, test) pair of them",
            within=30, env=EXAMPLES_ENV)


def test_fewer_files_than_workers_with_file_sharding(tmp_path):
    images, labels = digits(8)
    write_tfrecord(str(tmp_path / "train-0"), digit_records(images, labels))
    refused(tmp_path, ["towers", "--towers", "2", "--data", str(tmp_path / "train-*"), "--shard-by", "file",
                       "--batch-size", "4"],
            "--shard-by file: {} has 1 file(s) for 2 workers: give at least as many files as workers, or "
            "--shard-by record".format(tmp_path / "train-*"), argv0=os.path.join(BIN, "ps-baseline"))
