"""The classic distributed-TensorFlow tutorials' two other replication modes: in-graph replication (one client,
a tower per worker task, on real TF gRPC servers) and multi-device towers in
one process (the CPU split into logical devices). Both must equal one process
on the global batch."""
import signal

import pytest

from helpers import (PS_BASELINE, TINY, Tasks, assert_checkpoint_is_one_process_on_the_global_batch, json_in,
                     last_json, ps_and_worker_hosts, run_ok, task_args)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
IN_GRAPH = ["--replication", "in-graph"]
WATCHDOG_SEC = 15  # 2 misses 2 s apart, with slack for a loaded machine


def test_in_graph_with_w_towers_equals_one_process_on_the_global_batch(tmp_path):
    """Each tower's update of 2 micro-batches (--accumulate 2) included."""
    steps, lr, batch = 4, 0.1, 8
    summary = last_json(run_ok([*PS_BASELINE, "launch", *IN_GRAPH, "--num-ps", "2", "--num-workers", "2",
                                "--optimizer", "sgd", "--lr", str(lr), "--no-dropout", "--steps", str(steps),
                                *TINY, "--batch-size", str(batch), "--accumulate", "2", "--checkpoint-dir",
                                str(tmp_path), "--show-placement"], timeout=240))
    assert summary["mode"] == "ps-ingraph" and summary["steps"] == steps and summary["world_size"] == 2
    assert summary["towers"] == ["/job:worker/task:0", "/job:worker/task:1"]
    assert summary["timed_samples"] > 0 and summary["images_per_sec"] > 0
    assert_checkpoint_is_one_process_on_the_global_batch(str(tmp_path), steps, lr, batch, workers=2, accumulate=2)


def test_towers_with_batch_b_each_equal_one_process_on_the_global_batch(tmp_path):
    steps, lr, batch = 4, 0.1, 8
    # (each tower's batch b as 2 micro-batches of b/2: --accumulate 2)
    towers = last_json(run_ok([*PS_BASELINE, "towers", "--towers", "2", "--model", "mnist_mlp", "--optimizer",
                               "sgd", "--lr", str(lr), "--no-dropout", "--steps", str(steps), "--batch-size",
                               str(batch // 2), "--accumulate", "2", "--threads", "1",
                               "--dump-weights", str(tmp_path / "t.npz")]))
    assert towers["mode"] == "towers" and towers["world_size"] == 2 and len(towers["devices"]) == 2
    assert towers["devices"][0] != towers["devices"][1]
    one = last_json(run_ok(["ringtrain", "--model", "mnist_mlp", "--optimizer", "sgd", "--lr", str(lr),
                            "--no-dropout", "--steps", str(steps), "--batch-size", str(2 * batch),
                            "--threads", "1", "--dump-weights", str(tmp_path / "one.npz")]))
    assert one["world_size"] == 1
    import numpy as np
    with np.load(tmp_path / "t.npz") as a, np.load(tmp_path / "one.npz") as b:
        assert sorted(a.files) == sorted(b.files) and a.files
        for key in a.files:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)


def seed_cluster(tasks, ps, workers, *extra):
    """The classic distributed-TensorFlow tutorials' per-terminal commands, with --replication in-graph."""
    tasks.start("ps0", task_args(ps, workers, "ps", 0, *IN_GRAPH, "--threads", "1"))
    tasks.start("worker1", task_args(ps, workers, "worker", 1, *IN_GRAPH, "--threads", "1"))
    tasks.start("worker0", task_args(ps, workers, "worker", 0, *IN_GRAPH, *TINY, *extra))


def test_the_classic_per_terminal_commands_run_in_graph_replication(tmp_path):
    ps, workers = ps_and_worker_hosts(1, 2)
    with Tasks(str(tmp_path)) as tasks:
        seed_cluster(tasks, ps, workers, "--steps", "20")
        for name in ("worker0", "worker1", "ps0"):
            assert tasks.wait(name, 120) == 0, tasks.log(name)
        summary = [s for s in map(json_in, tasks.log("worker0").splitlines()) if s][-1]
        assert summary["mode"] == "ps-ingraph" and summary["steps"] == 20
        # the serving tasks exit when the client says training is over
        assert "worker task 1: training is over" in tasks.log("worker1")
        assert "ps task 0: training is over" in tasks.log("ps0")


def one_error_line(log):
    lines = [line for line in log.splitlines() if line.startswith("ps-baseline: error:")]
    assert len(lines) == 1 and "Traceback" not in log, log[-3000:]
    return lines[0]


def test_a_dead_in_graph_client_stops_every_task_with_one_line(tmp_path):
    ps, workers = ps_and_worker_hosts(1, 2)
    with Tasks(str(tmp_path)) as tasks:
        seed_cluster(tasks, ps, workers, "--steps", "100000")
        tasks.wait_for_text("worker0", "step 20/", timeout=90)
        assert tasks.kill("worker0") == -signal.SIGKILL
        for name in ("worker1", "ps0"):
            assert tasks.wait(name, WATCHDOG_SEC + 15) == 3, tasks.log(name)
            line = one_error_line(tasks.log(name))
            assert f"the in-graph client (worker 0) at {workers.split(',')[0]} stopped answering" in line


def test_a_dead_tower_worker_stops_the_client_with_one_line_naming_it(tmp_path):
    ps, workers = ps_and_worker_hosts(1, 2)
    with Tasks(str(tmp_path)) as tasks:
        seed_cluster(tasks, ps, workers, "--steps", "100000")
        tasks.wait_for_text("worker0", "step 20/", timeout=90)
        assert tasks.kill("worker1") == -signal.SIGKILL
        assert tasks.wait("worker0", WATCHDOG_SEC + 15) == 3, tasks.log("worker0")
        line = one_error_line(tasks.log("worker0"))
        assert f"worker task 1 (tower 1) at {workers.split(',')[1]} stopped answering" in line


def test_in_graph_refuses_what_it_cannot_do_in_one_line():
    from helpers import assert_one_line_error
    ps, workers = ps_and_worker_hosts(1, 2)
    assert_one_line_error(task_args(ps, workers, "worker", 0, *IN_GRAPH, "--api", "tf2"), "drop --api tf2")
    assert_one_line_error(task_args(ps, workers, "worker", 0, *IN_GRAPH, "--sync", "--replicas-to-aggregate",
                                    "1"), "--replicas-to-aggregate is for between-graph")
    assert_one_line_error([*PS_BASELINE, "towers", "--towers", "0"], "--towers")
    assert_one_line_error([*PS_BASELINE, "towers", "--resume"], "--resume needs --checkpoint-dir")
