"""PS training on real TF gRPC servers on localhost: sync equals one process
on the global batch, async learns, and a restarted chief resumes from its
checkpoint; the graph modes train in bfloat16."""
import math

import pytest

from helpers import (ONE_THREAD, PS_BASELINE, TINY, Tasks, assert_checkpoint_is_one_process_on_the_global_batch,
                     checkpoint_step, last_json, ok, once_more_after_tf_fetch_flake, run, run_ok, ps_and_worker_hosts,
                     task_args)

pytestmark = pytest.mark.slow


def launch(*args, timeout=240):
    return last_json(run_ok([*PS_BASELINE, "launch", *args], timeout=timeout))


@pytest.mark.timeout(300)
def test_sync_with_all_workers_equals_one_process_on_the_global_batch(tmp_path):
    """Each worker's update of 2 micro-batches (--accumulate 2) included."""
    steps, lr, batch = 4, 0.1, 8
    summary = launch("--num-ps", "2", "--num-workers", "2", "--sync", "--optimizer", "sgd",
                     "--lr", str(lr), "--no-dropout", "--steps", str(steps), *TINY,
                     "--batch-size", str(batch), "--accumulate", "2", "--checkpoint-dir", str(tmp_path))
    assert summary["mode"] == "ps-sync" and summary["steps"] == steps and summary["accumulate"] == 2

    assert_checkpoint_is_one_process_on_the_global_batch(str(tmp_path), steps, lr, batch, workers=2, accumulate=2)


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
    # Staleness counts the other workers' updates between a step's read and its
    # apply. A worker's steps are sequential, so each update of the other worker
    # lands inside at most one of them: the mean over all updates is at most 1.
    assert 0 <= summary["staleness_mean"] <= 1
    assert summary["staleness_max"] <= 60  # no step saw more than the other worker's updates


@pytest.mark.timeout(120)
@pytest.mark.parametrize("replication", [["--sync"], ["--replication", "in-graph"]], ids=["between", "in-graph"])
def test_graph_modes_train_convolutions_in_bfloat16(replication):
    """TF1 sessions ran Grappler's fused convolution, which has no bfloat16
    kernel, and failed at the first step (workloads/tfenv.session_config)."""
    summary = launch("--num-ps", "1", "--num-workers", "2", *replication, "--model", "mnist_cnn",
                     "--precision", "mixed_bfloat16", "--batch-size", "8", "--steps", "3", *ONE_THREAD)
    assert summary["precision"] == "mixed_bfloat16" and summary["steps"] == 3
    assert math.isfinite(summary["train_loss"]) and summary["test_samples"] == 1000


@pytest.mark.timeout(300)
def test_restarted_chief_resumes_from_the_last_checkpoint(tmp_path):
    ps, workers = ps_and_worker_hosts(1, 1)
    ckpt = str(tmp_path / "ckpt")
    chief = task_args(ps, workers, "worker", 0, *TINY, "--steps", "800", "--log-every", "50",
                      "--checkpoint-every", "100", "--checkpoint-dir", ckpt)
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("ps0", task_args(ps, workers, "ps", 0, "--threads", "1"))
        tasks.start("chief", chief)
        tasks.wait_for_text("chief", "step 300/800", timeout=120)
        tasks.kill("chief")  # the chief dies mid-run
        saved = checkpoint_step(ckpt)
        assert 100 <= saved < 800

        tasks.start("chief_again", chief + ["--resume"])  # the same command, continuing from the checkpoint
        assert tasks.wait("chief_again", 200) == 0, tasks.log("chief_again")
        log = tasks.log("chief_again")
        assert "restoring" in log and f"resuming at my step {saved}, global step {saved}" in log
        assert last_json(log)["steps"] == 800
        assert tasks.wait("ps0", 30) == 0  # the chief let the PS go when training was over


@pytest.mark.timeout(300)
def test_tf2_parameter_server_strategy_completes_and_learns():
    argv = [*PS_BASELINE, "launch", "--api", "tf2", "--num-ps", "1", "--num-workers", "2", "--steps", "40", *TINY]
    done = once_more_after_tf_fetch_flake(lambda: run(argv, timeout=120), reset=lambda: None)
    summary = last_json(ok(done, argv))
    assert summary["mode"] == "ps-tf2" and summary["api"] == "tf2"
    assert summary["steps"] == 80 and summary["world_size"] == 2
    assert summary["test_accuracy"] > 0.7
    assert "staleness_mean" in summary and "staleness_max" in summary


@pytest.mark.timeout(180)
def test_tf2_coordinator_says_its_workers_compute_float16_on_a_cpu():
    """The coordinator computes nothing: it asks TF what its workers compute on,
    and says, as every mode does, that float16 is slow there."""
    argv = [*PS_BASELINE, "launch", "--api", "tf2", "--num-ps", "1", "--num-workers", "2", "--steps", "3",
            "--precision", "mixed_float16", *TINY]
    done = once_more_after_tf_fetch_flake(lambda: run(argv, timeout=120), reset=lambda: None)
    out = ok(done, argv)
    assert "note: float16 on a CPU runs on TF's Eigen kernels" in out
    assert last_json(out)["precision"] == "mixed_float16"
