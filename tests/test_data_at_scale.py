"""The data pipeline at scale: a data set larger than the memory a trainer
may use trains through it; mixed precision trains and float16's loss scale
works; a user's model without --data trains on the embedded MNIST."""
import contextlib
import glob
import os
import time

import numpy as np
import pytest

from helpers import BIN, ENV, ONE_THREAD, last_json, run, run_ok

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
RINGTRAIN = os.path.join(BIN, "ringtrain")
LIMIT = 450 * 2 ** 20  # the trainer's memory: a TF process of mnist_mlp peaked at 290 MB here


@contextlib.contextmanager
def memory_cgroup(limit):
    """A cgroup (v1) of our own whose processes may use `limit` bytes; skips where none can be made."""
    root = "/sys/fs/cgroup/memory"
    path = os.path.join(root, f"ringtrain-test-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
    except OSError as e:
        pytest.skip(f"no memory cgroup of our own here ({e.strerror}: {root})")
    try:
        yield path
    finally:
        for _ in range(50):  # (a process the kernel killed leaves it a moment later)
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.1)


def test_a_data_set_larger_than_the_trainers_memory_trains_through_the_pipeline(tmp_path):
    """960 incompressible 512x512x3 PNGs (757 MB) in 4 TFRecord files, one epoch
    within 450 MB: the pipeline streams them (a shuffle window of 16 records),
    decodes and resizes them to the model's 28x28x1, and never holds them all."""
    from ringtrain.workloads import writers
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    tf = import_tensorflow_quietly()
    image = np.random.default_rng(0).integers(0, 256, (512, 512, 3), dtype=np.uint8)
    encoded = tf.io.encode_png(image, compression=0).numpy()
    for f in range(4):
        with tf.io.TFRecordWriter(str(tmp_path / f"train-{f}")) as writer:
            for i in range(240):
                writer.write(writers.example(tf, encoded, (f + i) % 10))
    size = sum(os.path.getsize(p) for p in glob.glob(str(tmp_path / "train-*")))
    assert size > 1.5 * LIMIT
    with memory_cgroup(LIMIT) as cgroup:
        done = run(["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$0" "$@"', RINGTRAIN, "--model", "mnist_mlp",
                    "--data", str(tmp_path / "train-*"), "--batch-size", "16", "--epochs", "1", "--shuffle-buffer", "16",
                    "--log-every", "1000", *ONE_THREAD], timeout=180)
        with open(os.path.join(cgroup, "memory.max_usage_in_bytes")) as f:
            peak = int(f.read())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]  # (the kernel kills it past the limit)
    summary = last_json(done.stdout)
    assert summary["epochs"] == 1 and summary["steps"] == 60 and peak < LIMIT < size  # 960 records in batches of 16


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_and_float16s_loss_scale_works(tmp_path, precision):
    """A normal run in 16 bits learns as float32 does, no update is non-finite,
    and float16's loss scale is checkpointed with the weights: still high
    (halved at most a few times), all of them finite."""
    import tensorflow as tf
    out = run_ok([RINGTRAIN, "--model", "mnist_mlp", "--precision", precision, "--steps", "60", "--batch-size", "32",
                  "--checkpoint-dir", str(tmp_path), "--log-every", "1000", *ONE_THREAD],
                 env=dict(ENV, ONEDNN_VERBOSE="1"))  # (oneDNN's primitives, each as it runs)
    summary = last_json(out)
    if precision == "mixed_float16":
        # oneDNN's reference kernels ran float16's dense layers with a bias 250x slower than float32's:
        # TF's Eigen kernels compute it, and the run says so (workloads/tfenv.kernels_for)
        assert "ref:any" not in out and "note: float16 on a CPU runs on TF's Eigen kernels" in out
    assert summary["precision"] == precision and summary["test_accuracy"] > 0.8  # chance is 0.1
    assert summary["skipped_steps"] == 0 and summary["loss_scale_skips"] <= 3
    checkpoint = tf.train.load_checkpoint(summary["checkpoint"])
    names = checkpoint.get_variable_to_shape_map()
    values = [checkpoint.get_tensor(n) for n in names]
    assert all(np.isfinite(v).all() for v in values if isinstance(v, np.ndarray) and v.dtype.kind == "f")
    scales = [checkpoint.get_tensor(n) for n in names if n.startswith("loss_scale/")]
    assert scales == ([] if precision == "mixed_bfloat16" else [2.0 ** (15 - summary["loss_scale_skips"])])
