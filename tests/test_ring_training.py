"""Ring mode under real launchers: correctness, identical ranks, every launch path."""
import os

import pytest

from helpers import ONE_THREAD, REPO, assert_same_weights, horovodrun, last_json, mpirun, run_ok, weights

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

# SGD, no lr scaling or warm-up, no dropout: the updates are a pure function of the data.
DETERMINISTIC = ["--optimizer", "sgd", "--lr", "0.05", "--no-lr-scaling", "--warmup-epochs", "0",
                 "--no-dropout", "--log-every", "1000", *ONE_THREAD]


def test_two_ranks_at_batch_b_equal_one_process_at_batch_2b(tmp_path):
    two = str(tmp_path / "two-{rank}.npz")
    one = str(tmp_path / "one-{rank}.npz")
    run_ok(horovodrun(2, "--model", "mnist_mlp", "--batch-size", "16", "--steps", "8",
                      "--dump-weights", two, *DETERMINISTIC))
    run_ok(["ringtrain", "--model", "mnist_mlp", "--batch-size", "32", "--steps", "8",
            "--dump-weights", one, *DETERMINISTIC])
    assert_same_weights(weights(two, 0), weights(one, 0))


@pytest.mark.parametrize("launcher", ["horovodrun", "horovodrun-gloo", "mpirun", "hostfile"])
def test_ranks_hold_identical_weights_under_every_launcher(tmp_path, launcher):
    dump = str(tmp_path / "w-{rank}.npz")
    args = ["--model", "mnist_cnn", "--batch-size", "16", "--steps", "6", "--log-every", "3",
            "--dump-weights", dump, *ONE_THREAD]
    cmd = {"horovodrun": lambda: horovodrun(2, *args),
           "horovodrun-gloo": lambda: horovodrun(2, *args, gloo=True),
           "mpirun": lambda: mpirun(2, *args),
           "hostfile": lambda: mpirun(2, *args,
                                      hostfile=os.path.join(REPO, "mpi_hostfiles", "localhost"))}
    summary = last_json(run_ok(cmd[launcher]()))
    assert summary["world_size"] == 2 and summary["steps"] == 6
    assert summary["controller"] == ("gloo" if launcher == "horovodrun-gloo" else "mpi")
    assert_same_weights(weights(dump, 0), weights(dump, 1), exact=True)  # dropout differs per rank


def test_summary_reports_measured_throughput_from_every_rank(tmp_path):
    out = run_ok(horovodrun(2, "--model", "mnist_mlp", "--steps", "30", "--summary-json",
                            str(tmp_path / "s.json"), *ONE_THREAD))
    printed = last_json(out)
    with open(tmp_path / "s.json") as f:
        saved = last_json(f.read())
    assert printed["images_per_sec"] == saved["images_per_sec"]
    per_worker = saved["images_per_sec_per_worker"]
    assert len(per_worker) == 2 and all(r > 0 for r in per_worker)
    # Global = all timed samples over the slowest rank's time: at most the sum of rates.
    assert saved["images_per_sec"] <= sum(per_worker) * (1 + 1e-9)
    assert saved["timed_samples"] == 2 * 32 * (30 - 3)  # warm-up steps excluded
    assert len(saved["window_images_per_sec"]) == 2
    assert {"test_accuracy", "train_loss", "wall_time_sec", "config"} <= set(saved)


def test_embedded_mnist_learns_on_two_ranks():
    summary = last_json(run_ok(horovodrun(2, "--model", "mnist_mlp", "--epochs", "1",
                                          *ONE_THREAD)))
    assert summary["test_samples"] == 1000
    assert summary["test_accuracy"] > 0.85


def test_horovod_knobs_keep_ranks_identical_and_write_timeline_and_tensorboard(tmp_path):
    dump, timeline, logs = str(tmp_path / "w-{rank}.npz"), tmp_path / "timeline.json", tmp_path / "tb"
    summary = last_json(run_ok(horovodrun(
        2, "--model", "mnist_mlp", "--steps", "8", "--log-every", "4", "--adasum",
        "--fp16-allreduce", "--cycle-time-ms", "2", "--fusion-threshold-mb", "16",
        "--horovod-timeline", str(timeline), "--log-dir", str(logs), "--dump-weights", dump,
        *ONE_THREAD)))
    assert summary["config"]["adasum"] and summary["config"]["fp16_allreduce"]
    assert_same_weights(weights(dump, 0), weights(dump, 1), exact=True)
    assert "ALLREDUCE" in timeline.read_text()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(logs))
