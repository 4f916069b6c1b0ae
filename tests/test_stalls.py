"""No silent hang: a frozen chief (SIGSTOP: alive, holding its sockets,
answering TCP connects, doing nothing) is named by the others, and the job
ends within --stall-timeout plus a margin; so is a TF collective worker that
is killed where no launcher ends the job; a rank that crashes in native code
prints its Python stacks."""
import os
import signal
import time

import psutil
import pytest

from helpers import BIN, ONE_THREAD, Tasks, descendant, generated_code, run

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


def test_a_frozen_chief_is_named_by_the_others_and_the_job_ends(tmp_path):
    """(The README's table freezes a worker in every mode; here the chief itself freezes.)"""
    with Tasks(str(tmp_path)) as tasks:
        job = tasks.start("ring", ["mpirun", "-np", "2", "-x", "PATH", os.path.join(BIN, "ringtrain"), *TRAIN])
        tasks.wait_for_text("ring", "step 20/", 120)
        code, log, seconds = freeze_and_wait(tasks, "ring", descendant(job.pid, ring_rank(0)))
    assert code != 0 and seconds < STALL + MARGIN, (code, seconds, log[-3000:])
    assert "stall watchdog: rank 0 (" in log and ") listens on 127.0.0.1:" in log
    lines = [line for line in log.splitlines() if "ringtrain: error:" in line]
    assert len(lines) == 1 and "Traceback" not in log, log[-3000:]
    assert "the chief, rank 0 (" in lines[0] and "stopped answering" in lines[0] and "--resume" in lines[0], lines


def test_a_killed_tf_collective_worker_launched_by_tf_config_is_named_and_the_job_ends(tmp_path):
    """TF's own launch (one process per worker, TF_CONFIG, no mpirun to end the
    job): worker 1 is killed mid-training; worker 0 names it in one line and exits,
    and removes the code AutoGraph generated for it (the killed one cannot)."""
    import json
    from ringtrain.multihost.net import free_ports
    workers = [f"localhost:{port}" for port in free_ports(2)]
    config = lambda i: json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
    temp = [tmp_path / f"tmp{i}" for i in (0, 1)]
    with Tasks(str(tmp_path)) as tasks:
        for i in (0, 1):
            temp[i].mkdir()
            tasks.start(f"worker{i}", ["env", f"TF_CONFIG={config(i)}", f"TMPDIR={temp[i]}",
                                       os.path.join(BIN, "ringtrain"), "--backend", "tf-collective", *TRAIN])
        tasks.wait_for_text("worker0", "step 20/", 120)
        tasks.kill("worker1")
        killed = time.monotonic()
        code = tasks.wait("worker0", STALL + MARGIN)
        log = tasks.log("worker0")
    assert code != 0 and time.monotonic() - killed < STALL + MARGIN, (code, log[-3000:])
    lines = [line for line in log.splitlines() if "ringtrain: error:" in line]
    assert len(lines) == 1 and "Traceback" not in log, log[-3000:]
    assert f"worker 1 at {workers[1]} stopped answering" in lines[0] and "--resume" in lines[0], lines
    assert [p for p in generated_code(temp[1]) if p.suffix == ".py"], "strategy.gather converts a function"
    assert not generated_code(temp[0]), generated_code(temp[0])


def test_a_crash_in_native_code_prints_every_threads_python_stack_and_mpirun_names_the_rank():
    """A segfault inside MPI, TF or Horovod: the rank's Python stacks come first
    (faulthandler, which MPI_Init leaves in place), then mpirun names the rank."""
    script = ("import ctypes\nfrom ringtrain.common.errors import run_cli\n"
              "def crash(argv):\n"
              "    ctypes.CDLL('libmpi.so.40', mode=ctypes.RTLD_GLOBAL).MPI_Init(None, None)\n"
              "    ctypes.string_at(0)\n"
              "run_cli('crash', crash)\n")
    done = run(["mpirun", "-np", "1", "-x", "PATH", os.path.join(BIN, "python"), "-c", script], timeout=60)
    assert done.returncode != 0
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr[-2000:]
    assert 'line 5 in crash' in done.stderr, done.stderr[-2000:]
    assert "rank 0" in done.stderr and "signal 11" in done.stderr, done.stderr[-2000:]
