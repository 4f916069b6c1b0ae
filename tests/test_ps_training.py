"""PS training on real TF gRPC servers on localhost: sync equals one process
on the global batch, async learns, and a restarted chief resumes from its
checkpoint."""
import os
import re
import signal

import numpy as np
import pytest

from conftest import last_json, run_ok
from ps_cluster import PS_BASELINE, TINY, Tasks, hosts, task_args


def launch(*args, timeout=240):
    return last_json(run_ok([*PS_BASELINE, "launch", *args], timeout=timeout))


@pytest.mark.timeout(300)
def test_sync_with_all_workers_equals_one_process_on_the_global_batch(tmp_path):
    steps, lr, batch = 4, 0.1, 8
    summary = launch("--num-ps", "2", "--num-workers", "2", "--sync", "--optimizer", "sgd",
                     "--lr", str(lr), "--no-dropout", "--steps", str(steps), *TINY,
                     "--batch-size", str(batch), "--checkpoint-dir", str(tmp_path))
    assert summary["mode"] == "ps-sync" and summary["steps"] == steps

    import tensorflow as tf
    from workloads import data, models
    from workloads.pipeline import as_float
    from workloads.sharding import epoch_shard

    dataset = data.load("mnist")
    reference = models.build("mnist_mlp", seed=0)
    for step in range(steps):  # one process, the two workers' batches together
        shards = [epoch_shard(len(dataset.train_labels), r, 2, batch, 0, 0) for r in range(2)]
        rows = slice(step * batch, (step + 1) * batch)
        idx = np.concatenate([s.indices[rows] for s in shards])
        weights = np.concatenate([s.weights[rows] for s in shards])
        with tf.GradientTape() as tape:
            losses = models.per_example_loss(reference(as_float(dataset.train_images[idx]), True),
                                             dataset.train_labels[idx])
            loss = tf.reduce_sum(weights * losses) / shards[0].global_counts[step]
        grads = tape.gradient(loss, reference.trainable_variables)
        for v, g in zip(reference.trainable_variables, grads):
            v.assign_sub(lr * g)

    checkpoint = tf.train.load_checkpoint(str(tmp_path))
    assert checkpoint.get_tensor("global_step") == steps
    for v in reference.trainable_variables:
        name = v.name.split(":")[0]  # "dense_1/kernel", as in the PS graph
        np.testing.assert_allclose(checkpoint.get_tensor(name), v.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


@pytest.mark.timeout(300)
def test_async_training_completes_and_learns():
    summary = launch("--num-ps", "2", "--num-workers", "2", "--steps", "60", *TINY)
    assert summary["mode"] == "ps-async"
    assert summary["world_size"] == 2 and summary["num_ps"] == 2
    assert summary["steps"] == 120  # async: every worker's update counts
    assert summary["reporting_workers"] == [0, 1]
    assert summary["test_samples"] == 1000  # the whole embedded test split
    assert summary["test_accuracy"] > 0.7  # chance is 0.1
    assert len(summary["images_per_sec_per_worker"]) == 2 and summary["images_per_sec"] > 0
    assert summary["staleness_max"] >= summary["staleness_mean"] >= 0


def checkpoint_step(folder):
    with open(os.path.join(folder, "checkpoint")) as f:
        return int(re.search(r'model_checkpoint_path: ".*-(\d+)"', f.read()).group(1))


@pytest.mark.timeout(300)
def test_restarted_chief_resumes_from_the_last_checkpoint(tmp_path):
    ps, workers = hosts(1), hosts(1)
    ckpt = str(tmp_path / "ckpt")
    chief = task_args(ps, workers, "worker", 0, *TINY, "--steps", "3000", "--log-every", "50",
                      "--checkpoint-every", "100", "--checkpoint-dir", ckpt)
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("ps0", task_args(ps, workers, "ps", 0, "--threads", "1"))
        tasks.start("chief", chief)
        tasks.wait_for_text("chief", "step 300/3000", timeout=120)
        os.killpg(tasks.procs["chief"].pid, signal.SIGKILL)  # the chief dies mid-run
        tasks.wait("chief", 10)
        saved = checkpoint_step(ckpt)
        assert 100 <= saved < 3000

        tasks.start("chief_again", chief)
        assert tasks.wait("chief_again", 200) == 0, tasks.log("chief_again")
        log = tasks.log("chief_again")
        assert "restoring" in log and f"resuming at my step {saved}, global step {saved}" in log
        assert last_json(log)["steps"] == 3000
        assert tasks.wait("ps0", 30) == 0  # the chief let the PS go when training was over


@pytest.mark.timeout(300)
def test_tf2_parameter_server_strategy_completes_and_learns():
    summary = launch("--api", "tf2", "--num-ps", "1", "--num-workers", "2", "--steps", "40", *TINY)
    assert summary["mode"] == "ps-tf2" and summary["api"] == "tf2"
    assert summary["steps"] == 80 and summary["world_size"] == 2
    assert summary["test_accuracy"] > 0.7
    assert "staleness_mean" in summary and "staleness_max" in summary
