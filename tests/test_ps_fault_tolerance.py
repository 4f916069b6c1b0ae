"""Fault tolerance of PS training, as the classic distributed-TensorFlow tutorials' "fault tolerance" section
asks: a dead non-chief worker does not stop async training and can rejoin
where it left off; sync with a backup worker survives a dead worker; a dead
PS stops the workers with one clear line within seconds, and the restarted
cluster resumes from the last checkpoint.

Real TF gRPC servers on localhost, one process per task (the per-task CLI),
killed with SIGKILL by process group at a logged step; and the same through
`launch`, which goes on where the mode allows, or restarts the worker."""
import os
import re
import signal
import time

import pytest

from helpers import (PS_BASELINE, TINY, Tasks, at_own_step, checkpoint_step, descendant, last_json, ps_and_worker_hosts,
                     ps_task, task_args)

pytestmark = pytest.mark.slow

PS_ONE_THREAD = ["--threads", "1"]
WATCHDOG_SEC = 15  # the watchdog needs 2 misses 2 s apart (~3-4 s seen); slack for a loaded machine


def kill(tasks, name):
    """SIGKILL the task's process group and reap it."""
    assert tasks.kill(name) == -signal.SIGKILL


def logged_steps(log):
    """The local steps a worker logged (`... step N/TOTAL ...`)."""
    return [int(n) for n in re.findall(r"\bstep (\d+)/\d+", log)]


def logged_global_steps(log):
    """The global steps a worker logged (`... global step G loss ...`)."""
    return [int(n) for n in re.findall(r"global step (\d+) loss", log)]


def start_cluster(tasks, ps, workers, worker_argv, suffix=""):
    """One PS and every worker at once (TF's import takes seconds on a loaded
    machine). The chief trains alone for a second or two before the others
    have their sessions, so tests use step counts in the hundreds (50-80/s)."""
    tasks.start(f"ps0{suffix}", task_args(ps, workers, "ps", 0, *PS_ONE_THREAD))
    for i in range(len(workers.split(","))):
        tasks.start(f"worker{i}{suffix}", worker_argv(i))


def resumed_at(log):
    """(my step, global step) from the `resuming at ...` line."""
    m = re.search(r"resuming at my step (\d+), global step (\d+)", log)
    assert m, f"no resume line:\n{log[-3000:]}"
    return int(m.group(1)), int(m.group(2))


@pytest.mark.timeout(150)
def test_dead_ps_stops_workers_with_one_line_and_the_cluster_resumes_from_its_checkpoint(tmp_path):
    steps, ckpt = 300, str(tmp_path / "ckpt")  # (slow steps, so the PS still serves when it is killed)
    ps, workers = ps_and_worker_hosts(1, 2)
    worker = lambda i: task_args(ps, workers, "worker", i, *TINY, "--simulate-gpu", "30", "--steps", str(steps),
                                 "--checkpoint-every", "40", "--checkpoint-dir", ckpt)
    with Tasks(str(tmp_path)) as tasks:
        start_cluster(tasks, ps, workers, worker)
        tasks.wait_for_text("worker1", "step 10/", timeout=60)
        worker1_in = max(logged_global_steps(tasks.log("worker1")))
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(ckpt, "checkpoint")) or checkpoint_step(ckpt) <= worker1_in:
            # a checkpoint with some of worker 1's steps in it too (the chief starts first)
            assert time.monotonic() < deadline, tasks.log("worker0")
            time.sleep(0.2)
        kill(tasks, "ps0")
        killed = time.monotonic()

        # Both workers notice within seconds and say so in one line: exit 3, no hang.
        for name in ("worker0", "worker1"):
            assert tasks.wait(name, WATCHDOG_SEC + 15) == 3, tasks.log(name)
            elapsed = time.monotonic() - killed
            print(f"{name} exited 3 {elapsed:.1f}s after the PS was killed")
            assert elapsed < WATCHDOG_SEC, f"{name} took {elapsed:.1f}s"
            log = tasks.log(name)
            errors = [line for line in log.splitlines() if line.startswith("ps-baseline: error:")]
            assert len(errors) == 1, log[-3000:]
            assert errors[0] == (f"ps-baseline: error: ps task 0 at {ps} stopped answering; training cannot go "
                                 "on; ending the job: restart the cluster with --resume (the same "
                                 "--checkpoint-dir) to go on from the last checkpoint"), errors[0]
            assert log.rstrip().endswith(errors[0])
            assert max(logged_steps(log)) < steps
        # What the last checkpoint holds (async: the other worker trains on while
        # the chief saves, so its global step may be past the file name's).
        import tensorflow as tf
        latest = tf.train.latest_checkpoint(ckpt)
        saved = tf.train.load_checkpoint(latest)
        saved_global, saved_worker_steps = (int(saved.get_tensor("global_step")), [
            int(saved.get_tensor(f"ps_baseline/worker_steps_{i}")) for i in range(2)])
        assert saved_global >= checkpoint_step(ckpt) > worker1_in

        # The same commands with --resume: restored from the checkpoint, and finished.
        start_cluster(tasks, ps, workers, lambda i: worker(i) + ["--resume"], "_again")
        for name in ("worker1_again", "worker0_again"):
            assert tasks.wait(name, 90) == 0, tasks.log(name)
        chief_log = tasks.log("worker0_again")
        assert f"worker 0: restoring {latest};" in chief_log
        chief_step, chief_saw = resumed_at(chief_log)
        worker_step, worker_saw = resumed_at(tasks.log("worker1_again"))
        assert [chief_step, worker_step] == saved_worker_steps
        # The first to read the global step did so before anyone trained again.
        assert min(chief_saw, worker_saw) == saved_global
        assert 0 < chief_step < steps and 0 < worker_step < steps
        summary = last_json(chief_log)
        assert summary["reporting_workers"] == [0, 1]
        assert summary["checkpoint"].startswith(os.path.join(ckpt, "model.ckpt-"))
        # async: the checkpoint's updates, plus what each worker still had to do
        assert summary["steps"] == saved_global + (steps - chief_step) + (steps - worker_step)
        assert checkpoint_step(ckpt) == summary["steps"]
        assert tasks.wait("ps0_again", 30) == 0


# --- the same through `launch` ------------------------------------------------------

def launch_and_kill_worker(tmp_path, workers, victim, *flags, steps=300):
    """`launch` with a simulated accelerator (steps slow enough that the kill
    lands mid-run); SIGKILL worker `victim` at its step 10. (exit status, log)."""
    cmd = [*PS_BASELINE, "launch", "--num-ps", "1", "--num-workers", str(workers), *TINY, "--simulate-gpu", "30",
           "--steps", str(steps), *flags]
    with Tasks(str(tmp_path)) as tasks:
        job = tasks.start("launch", cmd)
        tasks.wait_for_text("launch", at_own_step(victim, 10), 90)
        descendant(job.pid, ps_task("worker", victim)).kill()
        code = tasks.wait("launch", 100)
        return code, tasks.log("launch")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["async", "sync-with-a-backup"])
def test_launch_goes_on_without_a_dead_worker_where_the_mode_allows(mode, tmp_path):
    flags = ["--sync", "--replicas-to-aggregate", "2"] if mode != "async" else []
    code, log = launch_and_kill_worker(tmp_path, 3, 2, *flags)
    assert code == 0, log[-3000:]
    said = [line for line in log.splitlines() if line.startswith("ps-baseline launch: worker2 ")]
    assert len(said) == 1 and "killed by signal 9" in said[0] and "training goes on without it" in said[0], said
    summary = last_json(log)
    assert summary["reporting_workers"] == [0, 1] and summary["steps"] >= 300
    # nobody restarts it under launch: the chief does not wait --report-timeout (120 s) for its report
    assert "no report from worker(s) [2]: they went silent" in log
    assert "stopped every task" not in log


@pytest.mark.timeout(150)
def test_launch_stops_sync_training_that_needs_every_worker_when_one_dies(tmp_path):
    code, log = launch_and_kill_worker(tmp_path, 2, 1, "--sync")
    assert code != 0
    said = [line for line in log.splitlines() if "stopped every task" in line]
    assert len(said) == 1 and said[0].startswith("ps-baseline launch: worker1 was killed by signal 9"), log[-2000:]


@pytest.mark.timeout(150)
def test_launch_restarts_a_dead_worker_which_rejoins_where_it_left_off(tmp_path):
    steps = 300
    code, log = launch_and_kill_worker(tmp_path, 2, 1, "--restart-workers", steps=steps)
    assert code == 0, log[-3000:]
    assert "ps-baseline launch: worker1 was killed by signal 9 (SIGKILL); restarting it (1 of 3)" in log
    worker1 = "\n".join(line for line in log.splitlines() if line.startswith("[worker1]"))
    my_step, _ = resumed_at(worker1)
    assert 10 <= my_step < steps and min(logged_steps(worker1.split("resuming at")[1])) > my_step
    summary = last_json(log)
    # async: every worker did all its steps, the killed one's cut-off step neither lost nor counted twice
    assert summary["reporting_workers"] == [0, 1] and summary["steps"] == 2 * steps
