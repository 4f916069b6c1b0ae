"""A scheduler's signal stops training at a step every process agrees on,
with a checkpoint there, one line naming the signal and the step, and exit
75 (stopped early, resumable); a run resumed from that checkpoint ends with
the weights of a run that was never stopped (sync modes). The signal may reach
one process of the job, or the launcher. SLURM's scancel and requeue:
tests/test_slurm.py; every mode: the README's table (tests/test_mode_table.py)."""
import os
import re
import signal
import subprocess
import time

import pytest

from helpers import (BIN, ENV, ONE_THREAD, PS_BASELINE, REPO, Tasks, assert_same_weights, checkpoint_step, horovodrun,
                     mpirun, own_tmpfs, wait_until, weights)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
EXIT_PREEMPTED = 75
SMALL = ["--model", "mnist_cnn", "--batch-size", "16", "--optimizer", "sgd", "--lr", "0.05", "--no-dropout",
         "--log-every", "10", "--checkpoint-every", "100000", *ONE_THREAD]
STEPS = 600  # the job's length: the signal lands around step 40, whatever the machine's speed
# (mpirun passes Ctrl-C on 5 s late: 2 ranks made 300 steps in 5.1 s on a fast morning, 2026-11-28;
# a PS task's flag stops training within a step or two)
IN_GRAPH_STEPS = 120


def stopped_line(log):
    lines = [line for line in log.splitlines() if ": stopped by " in line]
    assert len(lines) == 1 and "agreed by every" in lines[0], log[-3000:]
    return lines[0]


def stopped_at(line):
    return int(re.search(r"after step (\d+)", line).group(1))


def signal_at_step(tasks, name, step, send):
    """Once the job's log shows step `step` (its log lines every 10), send(the job)."""
    tasks.wait_for_text(name, re.compile(rf"\bstep {step}/"), 180)
    send(tasks.procs[name])


def test_ctrl_c_stops_ring_ranks_at_one_step_and_the_resumed_run_ends_as_if_never_stopped(tmp_path, mnist_records):
    """Ctrl-C at a terminal reaches mpirun's process group (its ranks have groups
    of their own), twice here: mpirun passes SIGTERM on to its ranks after
    odls_base_sigkill_timeout seconds (1 by default, too short for a machine as
    busy as this one; the sbatch script sets 5), and SIGKILL as long after
    that. The second Ctrl-C must change nothing. mpirun, interrupted, exits
    with a status of its own. Read from TFRecord files (each rank its own):
    the checkpoint keeps the data's position, so the resumed run reads exactly
    the samples of the run never stopped."""
    ckpt, dump = tmp_path / "ckpt", str(tmp_path / "w-{rank}.npz")
    small = [*SMALL, "--data", mnist_records]
    argv = mpirun(2, *small, "--checkpoint-dir", str(ckpt))
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("job", ["env", "OMPI_MCA_odls_base_sigkill_timeout=5", *argv, "--steps", str(STEPS)])
        signal_at_step(tasks, "job", 40, lambda job: [os.killpg(job.pid, signal.SIGINT) for _ in range(2)])
        assert tasks.wait("job", 60) != 0, tasks.log("job")[-3000:]
        line = stopped_line(tasks.log("job"))
    assert "stopped by SIGTERM" in line and checkpoint_step(ckpt) == stopped_at(line) < STEPS, line
    with Tasks(str(tmp_path)) as tasks:  # resumed, and never stopped
        tasks.start("resumed", argv + ["--steps", str(STEPS), "--resume", "--dump-weights", dump])
        tasks.start("whole", mpirun(2, *small, "--steps", str(STEPS),
                                    "--dump-weights", dump.replace("w-", "whole-")))
        # Two jobs of 2 ranks share the 2 cores: on a slow day (a Python loop of 10^7
        # additions 1.6 s) the resumed run had 50 of its 600 steps left at 120 s.
        assert tasks.wait("resumed", 300) == 0 and tasks.wait("whole", 300) == 0, tasks.log("resumed")[-3000:]
    assert_same_weights(weights(dump, 0), weights(dump.replace("w-", "whole-"), 0))


def test_sigterm_to_horovodrun_leaves_a_resumable_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    argv = horovodrun(2, *SMALL, "--checkpoint-dir", str(ckpt), gloo=True)
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("job", argv + ["--steps", "100000"])
        signal_at_step(tasks, "job", 40, lambda job: job.popen.send_signal(signal.SIGTERM))
        # (rank 0's status, passed on: Horovod patch 0011)
        assert tasks.wait("job", 60) == EXIT_PREEMPTED, tasks.log("job")[-3000:]
        line = stopped_line(tasks.log("job"))
    assert checkpoint_step(ckpt) == stopped_at(line)
    done = subprocess.run([*mpirun(2, *SMALL, "--checkpoint-dir", str(ckpt)),
                           "--resume", "--steps", str(stopped_at(line) + 10)], env=ENV, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and f"steps {stopped_at(line)}.." in done.stdout, done.stdout[-3000:]


def test_sigterm_to_a_ps_task_stops_in_graph_training_and_the_resumed_run_ends_as_if_never_stopped(tmp_path):
    """The signal reaches PS task 0 only: it raises the job's stop flag and
    serves on while the client saves. (In-graph replication is synchronous and
    deterministic; sync between-graph PS is not bit for bit, even uninterrupted:
    SyncReplicasOptimizer's token queue may give one update two gradients of
    the faster worker.)"""
    ckpt, dump = tmp_path / "ckpt", str(tmp_path / "w-{rank}.npz")
    launch = [*PS_BASELINE, "launch", "--num-ps", "1", "--num-workers", "2", "--replication", "in-graph", *SMALL]
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("job", launch + ["--checkpoint-dir", str(ckpt), "--steps", str(IN_GRAPH_STEPS)])
        signal_at_step(tasks, "job", 40, lambda job: ps_task_0(job).send_signal(signal.SIGTERM))
        assert tasks.wait("job", 60) == EXIT_PREEMPTED, tasks.log("job")[-3000:]
        log = tasks.log("job")
    line = stopped_line(log)
    assert "ps task 0: SIGTERM: the job stops" in log and checkpoint_step(ckpt) == stopped_at(line)
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("resumed", launch + ["--checkpoint-dir", str(ckpt), "--steps", str(IN_GRAPH_STEPS), "--resume",
                                         "--dump-weights", dump])
        assert tasks.wait("resumed", 120) == 0, tasks.log("resumed")[-3000:]
        tasks.start("whole", launch + ["--steps", str(IN_GRAPH_STEPS),
                                       "--dump-weights", dump.replace("w-", "whole-")])
        assert tasks.wait("whole", 120) == 0, tasks.log("whole")[-3000:]
    assert_same_weights(weights(dump, 0), weights(dump.replace("w-", "whole-"), 0))


def ps_task_0(job):
    import psutil
    return next(p for p in psutil.Process(job.pid).children(recursive=True)
                if "--job_name=ps" in p.cmdline() and "--task_index=0" in p.cmdline())


def test_a_signal_before_training_starts_ends_the_run_at_once_with_one_line(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = subprocess.Popen([os.path.join(BIN, "ringtrain"), *SMALL, "--checkpoint-dir", str(ckpt)], env=ENV,
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # (its flags parsed; TensorFlow still loading)
    job.send_signal(signal.SIGTERM)
    out, err = job.communicate(timeout=30)
    assert job.returncode == EXIT_PREEMPTED, out + err
    assert err.strip().splitlines() == [
        f"ringtrain: stopped by SIGTERM before training started: nothing to save; run the same command again to "
        f"start (exit {EXIT_PREEMPTED})"], err
    assert not ckpt.exists() or not os.listdir(ckpt)


def test_a_checkpoint_folder_that_cannot_be_written_at_the_signal_is_one_line_and_not_resumable(tmp_path):
    sessions = tmp_path / "ompi"  # (OpenMPI's session folders of this one-process MPI job)
    sessions.mkdir()
    with own_tmpfs(tmp_path / "disk", "ringtrain-test-ro", "size=16m") as disk, Tasks(str(tmp_path)) as tasks:
        ckpt = disk / "ckpt"
        tasks.start("job", ["env", f"OMPI_MCA_orte_tmpdir_base={sessions}", os.path.join(BIN, "ringtrain"), *SMALL,
                            "--steps", "100000", "--checkpoint-dir", str(ckpt)])
        tasks.wait_for_text("job", re.compile(r"\bstep 30/"), 120)
        assert job_family_paths(sessions), session_paths(sessions)  # (its orted's, as it trains)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        tasks.procs["job"].popen.send_signal(signal.SIGUSR1)
        code = tasks.wait("job", 60)
        log = tasks.log("job")
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    assert code == 3, log[-3000:]
    errors = [line for line in log.splitlines() if "error:" in line]
    assert len(errors) == 1 and "cannot write the checkpoint of step" in errors[0] and "read-only" in errors[0], log
    # it ended with MPI_Finalize: OpenMPI removed the session folder (its orted does so as the job exits: a moment after)
    wait_until(lambda: not job_family_paths(sessions), 20, lambda: session_paths(sessions))


def session_paths(folder):
    """Every path under OpenMPI's session folder, sorted. (os.walk, unlike rglob, skips a
    folder removed while it lists, as the orted removes them when its job exits.)"""
    return sorted(os.path.join(top, name) for top, folders, files in os.walk(folder) for name in folders + files)


def job_family_paths(folder):
    """The paths of the session folder's job families (jf.*): there while an orted runs."""
    return [path for path in session_paths(folder) if "/jf." in path]
