"""No silent hang: a frozen rank or task (SIGSTOP: alive, holding its sockets,
answering TCP connects, doing nothing) is named, and the job ends within
--stall-timeout plus a margin, or goes on where it can do without it."""
import os
import signal
import time

import psutil
import pytest

from helpers import BIN, ONE_THREAD, PS_BASELINE, Tasks, descendant, ps_task

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
STALL = 8      # --stall-timeout in these tests
MARGIN = 15    # the bound: a frozen rank ends the job within --stall-timeout + 15 s
TRAIN = ["--model", "mnist_mlp", "--batch-size", "16", "--steps", "100000", "--log-every", "10", *ONE_THREAD,
         "--stall-timeout", str(STALL)]


def ring_rank(rank):
    return lambda p: p.environ().get("OMPI_COMM_WORLD_RANK") == str(rank) and "ringtrain" in " ".join(p.cmdline())


def freeze_and_wait(tasks, name, victim, timeout=STALL + MARGIN):
    """SIGSTOP `victim`; the job must end within `timeout`. Returns (exit status, log)."""
    victim.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        code = tasks.wait(name, timeout)
    finally:
        try:
            victim.send_signal(signal.SIGCONT)  # let it die normally if anything is left
        except psutil.Error:
            pass
    return code, tasks.log(name), time.monotonic() - frozen_at


@pytest.mark.parametrize("frozen", [1, 0])
def test_a_frozen_rank_is_named_and_the_job_ends(frozen, tmp_path):
    with Tasks(str(tmp_path)) as tasks:
        job = tasks.start("ring", ["mpirun", "-np", "2", "-x", "PATH", os.path.join(BIN, "ringtrain"), *TRAIN])
        tasks.wait_for_text("ring", "step 20/", 120)
        code, log, seconds = freeze_and_wait(tasks, "ring", descendant(job.pid, ring_rank(frozen)))
    assert code != 0, log
    assert "stall watchdog: rank 0 listens on 127.0.0.1:" in log
    lines = [line for line in log.splitlines() if "ringtrain: error:" in line]
    assert len(lines) == 1, log[-3000:]
    if frozen == 1:  # rank 0 names it
        assert "stopped answering: rank 1" in lines[0] and "--resume" in lines[0], lines
    else:            # rank 0 is the frozen one: rank 1 says so
        assert "rank 0" in lines[0] and "stopped answering" in lines[0], lines
    assert "Traceback" not in log


def test_a_frozen_sync_worker_is_named_by_the_chief_and_the_job_ends(tmp_path):
    with Tasks(str(tmp_path)) as tasks:
        job = tasks.start("launch", [*PS_BASELINE, "launch", "--num-ps", "1", "--num-workers", "2", "--sync",
                                     *TRAIN])
        tasks.wait_for_text("launch", "global step 20 ", 150)
        code, log, _ = freeze_and_wait(tasks, "launch", descendant(job.pid, ps_task("worker", 1)))
    assert code != 0, log
    assert "worker 1 at localhost:" in log and "sent no heartbeat" in log and "sync training" in log, log[-3000:]
    assert "Traceback" not in log


def test_a_frozen_async_worker_is_named_and_the_others_finish(tmp_path):
    # slow steps (a simulated accelerator), so that the chief is still training when the freeze is noticed
    steps = ["--steps", "500", "--simulate-gpu", "30", "--report-timeout", "5"]
    with Tasks(str(tmp_path)) as tasks:
        job = tasks.start("launch", [*PS_BASELINE, "launch", "--num-ps", "1", "--num-workers", "2", *TRAIN, *steps])
        tasks.wait_for_text("launch", "step 20/500", 150)
        victim = descendant(job.pid, ps_task("worker", 1))
        victim.send_signal(signal.SIGSTOP)
        try:
            tasks.wait_for_text("launch", "sent no heartbeat", STALL + MARGIN)
            code = tasks.wait("launch", 120)
        finally:
            try:
                victim.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
        log = tasks.log("launch")
    assert "worker 1 at localhost:" in log and "training goes on without it" in log, log[-3000:]
    # the chief finished its own 500 steps and summarised without the frozen worker
    assert "no report from worker(s) [1]" in log and '"reporting_workers": [0]' in log, log[-3000:]
    assert code is not None
