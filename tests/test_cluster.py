"""Across hosts, on a simulated cluster of network-namespace hosts (h1..h3,
each with its own hostname, address and sshd) that the test run builds and
tears down: ring under every launcher, PS sync and async (by `launch` and by
mpirun), a task killed and a host crashed, the classic distributed-TensorFlow tutorials' per-terminal commands, and `down` itself."""
import os
import signal
import subprocess
import sys
import time
import zlib

import pytest

from helpers import (BIN, ONE_THREAD, PS_BASELINE, TINY, Tasks, at_own_step, assert_checkpoint_is_one_process_on_the_global_batch,
                     checkpoint_step,
                     assert_one_line_error, assert_same_weights, last_json, run, run_ok, weights)
from ringtrain.common.errors import EXIT_STOPPED
from ringtrain.multihost import procs, simcluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DETERMINISTIC = ["--optimizer", "sgd", "--lr", "0.05", "--no-lr-scaling", "--warmup-epochs", "0",
                 "--no-dropout", "--log-every", "1000", *ONE_THREAD]


def on(cluster, host, *argv):
    """argv run on `host` of the cluster, as a user types it: ringtrain-cluster exec HOST -- ..."""
    return [os.path.join(BIN, "ringtrain-cluster"), "--name", cluster.name, "exec", host, "--", *argv]


def ps_launch(cluster, *args):
    return on(cluster, "h1", *PS_BASELINE, "launch", "--hostfile", cluster.hostfile, *args)


def test_ps_sync_across_hosts_equals_one_process_on_the_global_batch(cluster, tmp_path):
    steps, lr, batch = 4, 0.1, 8
    out = run_ok(ps_launch(cluster, "--num-ps", "2", "--num-workers", "2", "--sync", "--optimizer", "sgd",
                           "--lr", str(lr), "--no-dropout", "--steps", str(steps), *TINY,
                           "--batch-size", str(batch), "--checkpoint-dir", str(tmp_path)), timeout=240)
    summary = last_json(out)
    # The chief on h1; PS tasks on the other hosts; every line tagged with its host and task.
    assert summary["hosts"] == ["h1", "h2"]
    assert [a.split(":")[0] for a in summary["launch"]["ps_hosts"]] == ["h2", "h3"]
    assert "[h1 worker0]" in out and "[h3 ps1]" in out
    assert_checkpoint_is_one_process_on_the_global_batch(str(tmp_path), steps, lr, batch, workers=2)


def test_ps_async_across_hosts_learns(cluster):
    summary = last_json(run_ok(ps_launch(cluster, "--num-ps", "1", "--num-workers", "3", "--steps", "60", *TINY),
                               timeout=240))
    assert summary["mode"] == "ps-async" and summary["steps"] == 180
    assert summary["hosts"] == ["h1", "h2", "h3"]
    assert summary["test_accuracy"] > 0.7


def assert_no_process_left_on_any_host(cluster, timeout=10):
    """Every host's network namespace holds its sshd and nothing else (an
    ssh session's server side may take a moment to go)."""
    left = lambda: {h.name: [p for p in simcluster.processes_in(h.netns) if p != h.sshd_pid]
                    for h in cluster.hosts}
    deadline = time.monotonic() + timeout
    while any(left().values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == {h.name: [] for h in cluster.hosts}


def pid_on(cluster, host, match):
    """The PID of the first process on `host` whose argv satisfies match(argv), or None."""
    for pid in simcluster.processes_in(cluster.host(host).netns):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode().split("\0")
        except OSError:
            continue
        if match(argv):
            return pid
    return None


def task_pid(cluster, host, job):
    """The PID of a `python -m ps_baseline --job_name=JOB` task on `host` (not its guard)."""
    return pid_on(cluster, host, lambda argv: argv[1:3] == ["-m", "ps_baseline"] and f"--job_name={job}" in argv)


def test_a_task_killed_on_a_remote_host_ends_the_job_naming_it_and_leaves_nothing(cluster, tmp_path):
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("launch", ps_launch(cluster, "--num-ps", "1", "--num-workers", "2", "--steps", "100000", *TINY))
        tasks.wait_for_text("launch", "[h2 worker1] worker 1: epoch 1 step 5/", timeout=120)
        victim = task_pid(cluster, "h2", "ps")
        assert victim, "no PS task on h2"
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        assert tasks.wait("launch", 60) != 0
        assert time.monotonic() - killed < 30
        errors = [line for line in tasks.log("launch").splitlines() if line.startswith("ps-baseline launch:")
                  and "stopped" in line]
        assert errors == ["ps-baseline launch: ps0 on h2 was killed by signal 9 (SIGKILL); "
                          "stopped every task on every host"], tasks.log("launch")[-2000:]
    assert_no_process_left_on_any_host(cluster)


def test_ctrl_c_on_the_launcher_stops_every_task_on_every_host(cluster, tmp_path):
    with Tasks(str(tmp_path)) as tasks:
        launcher = tasks.start("launch", ps_launch(cluster, "--num-ps", "2", "--num-workers", "2", "--steps",
                                                   "100000", *TINY))
        tasks.wait_for_text("launch", "[h2 worker1] worker 1: epoch 1 step 5/", timeout=120)
        os.kill(launcher.pid, signal.SIGINT)
        # every task stops after a step the workers agree on; nowhere to save: exit 3, said once
        assert tasks.wait("launch", 30) == EXIT_STOPPED
        log = tasks.log("launch")
        assert "ps-baseline: stopped by SIGINT after step" in log and "a rerun starts over (exit 3)" in log, log[-2000:]
        assert "exited with status" not in log, log[-2000:]
    assert_no_process_left_on_any_host(cluster)


# --- PS jobs started by mpirun: each rank takes its task from its rank ----------------

def ps_mpirun(cluster, *args, mpirun_flags=()):
    """mpirun -np 3 over h1..h3 (one slot each): rank 0 the PS task on h1, ranks 1, 2 the workers."""
    return on(cluster, "h1", "mpirun", *mpirun_flags, "--hostfile", cluster.hostfile, "-np", "3", "-x", "PATH", "-x",
              "PYTHONUNBUFFERED", os.path.join(BIN, "ps-baseline"), "--num-ps", "1", *args)


def test_ps_sync_under_mpirun_across_hosts_equals_one_process_on_the_global_batch(cluster, tmp_path):
    steps, lr, batch = 4, 0.1, 8
    out = run_ok(ps_mpirun(cluster, "--sync", "--optimizer", "sgd", "--lr", str(lr), "--no-dropout", "--steps",
                           str(steps), *TINY, "--batch-size", str(batch), "--checkpoint-dir", str(tmp_path)),
                 timeout=240)
    assert "tasks by mpirun rank: 0 ps:0 (h1:" in out and ", 2 worker:1 (h3:" in out
    assert last_json(out)["hosts"] == ["h2", "h3"]
    assert_checkpoint_is_one_process_on_the_global_batch(str(tmp_path), steps, lr, batch, workers=2)


def test_a_task_killed_under_mpirun_ends_the_job_and_its_rank_names_the_task(cluster, tmp_path):
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("mpirun", ps_mpirun(cluster, "--steps", "100000", *TINY))
        tasks.wait_for_text("mpirun", "worker 1: epoch 1 step 5/", timeout=120)
        victim = pid_on(cluster, "h3", lambda argv: any(a.endswith("ps-baseline") for a in argv))
        assert victim, "no worker task on h3"
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        assert tasks.wait("mpirun", 60) != 0
        assert time.monotonic() - killed < 30
        log = tasks.log("mpirun")
        assert ", 2 worker:1 (h3:" in log  # our line: rank 2 is worker 1 ...
        assert "process rank 2 with PID" in log and "on node h3 exited on signal 9" in log  # ... mpirun's banner
    assert_no_process_left_on_any_host(cluster)


def test_a_frozen_rank_on_another_host_is_named_where_gloo_coordinates_the_ring(cluster, tmp_path):
    """Under mpirun across hosts Gloo coordinates Horovod's rounds (patch 0014), and its
    own timeout waits 10 s longer than --stall-timeout: the watchdog names the rank, and
    the job ends."""
    stall = 8
    hosts = tmp_path / "hosts"
    hosts.write_text("h1 slots=1\nh2 slots=1\n")
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("ring", on(cluster, "h1", "mpirun", "--hostfile", str(hosts), os.path.join(BIN, "ringtrain"),
                               "--model", "mnist_mlp", "--batch-size", "16", "--steps", "100000", "--log-every",
                               "10", *ONE_THREAD, "--stall-timeout", str(stall)))
        tasks.wait_for_text("ring", "step 20/", timeout=120)
        victim = pid_on(cluster, "h2", lambda argv: any(a.endswith("/ringtrain") for a in argv))
        assert victim, "no rank on h2"
        os.kill(victim, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            code = tasks.wait("ring", stall + 30)
        finally:
            os.kill(victim, signal.SIGCONT)
        seconds, log = time.monotonic() - frozen, tasks.log("ring")
    assert code != 0 and seconds < stall + 15, (code, seconds, log[-3000:])
    lines = [line for line in log.splitlines() if "ringtrain: error:" in line]
    assert len(lines) == 1 and "rank 1 (h2)" in lines[0] and "stopped answering" in lines[0], log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert_no_process_left_on_any_host(cluster)


@pytest.mark.parametrize("launcher", ["launch", "mpirun"])
def test_a_dead_host_ends_the_job_with_a_line_naming_it(cluster_to_crash, tmp_path, launcher):
    """h3 loses power mid-job: its link goes silent and all its processes die.
    launch: a worker names the PS task that stopped answering. mpirun: the ssh
    that held mpirun's daemon on h3 gives up (ServerAliveInterval) and names it."""
    cluster = cluster_to_crash
    if launcher == "launch":  # ps1 on h3
        argv, named = ps_launch(cluster, "--num-ps", "2", "--num-workers", "2", "--sync", "--steps", "100000",
                                *TINY), "ps task 1 at h3:"
    else:  # rank 2, worker 1, on h3
        argv, named = ps_mpirun(cluster, "--sync", "--steps", "100000", *TINY), "Timeout, server h3 not responding."
    with Tasks(str(tmp_path)) as tasks:
        tasks.start(launcher, argv)
        tasks.wait_for_text(launcher, at_own_step(1, 5), timeout=120)
        simcluster.crash(cluster, "h3")
        crashed = time.monotonic()
        assert tasks.wait(launcher, 90) != 0
        assert time.monotonic() - crashed < 45
        assert named in tasks.log(launcher), tasks.log(launcher)[-3000:]
    assert_no_process_left_on_any_host(cluster)
    if launcher == "mpirun":  # the dead daemon's session folder stays, in the cluster's folder that `down` removes
        assert os.path.isdir(os.path.join(cluster.session_tmp, f"ompi.h3.{os.getuid()}"))


def test_async_under_mpirun_with_enable_recovery_survives_a_dead_worker(cluster, tmp_path):
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("mpirun", ps_mpirun(cluster, "--steps", "300", *TINY, mpirun_flags=["--enable-recovery"]))
        tasks.wait_for_text("mpirun", "worker 1: epoch 1 step 5/", timeout=120)
        os.kill(pid_on(cluster, "h3", lambda argv: any(a.endswith("ps-baseline") for a in argv)), signal.SIGKILL)
        assert tasks.wait("mpirun", 120) == 0
        log = tasks.log("mpirun")
    assert "no report from worker(s) [1]: they went silent (dead or frozen)" in log
    summary = last_json(log)
    assert summary["mode"] == "ps-async" and summary["reporting_workers"] == [0] and summary["test_accuracy"] > 0.7
    assert_no_process_left_on_any_host(cluster)


def test_ctrl_c_on_mpirun_stops_every_ps_task_on_every_host(cluster, tmp_path):
    with Tasks(str(tmp_path)) as tasks:
        launcher = tasks.start("mpirun", ps_mpirun(cluster, "--sync", "--steps", "100000", *TINY,
                                                   "--checkpoint-dir", str(tmp_path / "ckpt"),
                                                   "--checkpoint-every", "20"))
        tasks.wait_for_text("mpirun", at_own_step(1, 25), timeout=120)
        os.kill(launcher.pid, signal.SIGINT)
        assert tasks.wait("mpirun", 30) != 0
    assert_no_process_left_on_any_host(cluster)
    assert checkpoint_step(str(tmp_path / "ckpt")) >= 20  # what the chief saved is kept, and readable


def test_the_classic_per_terminal_commands_run_with_tasks_on_different_hosts(cluster, tmp_path):
    flags = ["--ps_hosts=h3:2222", "--worker_hosts=h1:2222,h2:2222", "--sync", *TINY, "--steps", "20"]
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("ps", on(cluster, "h3", *PS_BASELINE, *flags, "--job_name=ps", "--task_index=0"))
        tasks.start("worker1", on(cluster, "h2", *PS_BASELINE, *flags, "--job_name=worker", "--task_index=1"))
        tasks.start("chief", on(cluster, "h1", *PS_BASELINE, *flags, "--job_name=worker", "--task_index=0"))
        for name in ("chief", "worker1", "ps"):
            assert tasks.wait(name, 180) == 0, tasks.log(name)[-3000:]
        assert last_json(tasks.log("chief"))["steps"] == 20


def test_a_task_started_on_the_wrong_host_says_which_host_it_belongs_to(cluster):
    assert_one_line_error(on(cluster, "h1", *PS_BASELINE, "--ps_hosts=h3:2222", "--worker_hosts=h1:2222",
                             "--job_name=ps", "--task_index=0"),
                          "ps task 0 is h3:2222, but h3 is not this host (h1): start it on h3", code=2)


def test_arguments_cross_ssh_as_words_never_as_shell_syntax(cluster, tmp_path):
    marker = tmp_path / "pwned"
    words = ["a b", f"$(touch {marker})", f"; touch {marker}", "'quoted'", '"double"', "*", "back\\slash"]
    done = run(on(cluster, "h1", sys.executable, "-c",
                  "from ringtrain.multihost import procs; import sys; "
                  "d = procs.run([sys.executable, '-c', 'import sys; print(sys.argv[1:])', *sys.argv[1:]], "
                  "host='h2', timeout=60); print(d.stdout, end=''); sys.exit(d.returncode)", *words))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(words)
    assert not marker.exists()


def test_down_leaves_no_namespace_interface_process_file_or_route(cluster):
    name = f"rtd{os.getpid() % 100000}"
    up = run([os.path.join(BIN, "ringtrain-cluster"), "--name", name, "up", "--hosts", "2"], timeout=120)
    assert up.returncode == 0, up.stderr
    built = simcluster.load(name)
    sshd = [h.sshd_pid for h in built.hosts]
    done = run([os.path.join(BIN, "ringtrain-cluster"), "--name", name, "down"], timeout=120)
    assert done.returncode == 0, done.stderr
    assert not [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if ns.startswith(f"{name}-")]
    assert not [pid for pid in sshd if procs.is_alive(pid)]
    assert not os.path.exists(built.state_dir)
    assert not any(d.startswith(f"{name}-") for d in os.listdir(simcluster.NETNS_ETC))
    routes = subprocess.run(["ip", "route", "show", built.subnet], capture_output=True, text=True).stdout
    assert routes.strip() == ""
    status = run([os.path.join(BIN, "ringtrain-cluster"), "--name", name, "status"], timeout=30)
    assert status.returncode != 0 and "is not up" in status.stderr


def test_a_name_that_hashes_to_a_held_subnet_gets_another_and_its_down_keeps_the_others_route(cluster):
    held = int(cluster.subnet.split(".")[2])
    name = next(n for n in (f"rth{i}" for i in range(100000)) if zlib.crc32(n.encode()) % 256 == held)
    up = run([os.path.join(BIN, "ringtrain-cluster"), "--name", name, "up", "--hosts", "1"], timeout=120)
    assert up.returncode == 0, up.stderr
    try:
        assert simcluster.load(name).subnet != cluster.subnet
    finally:
        done = run([os.path.join(BIN, "ringtrain-cluster"), "--name", name, "down"], timeout=120)
    assert done.returncode == 0, done.stderr
    routes = subprocess.run(["ip", "route", "show", cluster.subnet], capture_output=True, text=True).stdout
    assert routes.startswith("unreachable"), routes
    again = run(on(cluster, "h1", "true"), timeout=60)  # the held cluster still works
    assert again.returncode == 0, again.stderr


def test_doctor_checks_the_clusters_hostfile_from_a_host(cluster):
    """ssh to every host and this install there: what mpirun and horovodrun need first."""
    ok = run(on(cluster, "h1", os.path.join(BIN, "ringtrain"), "doctor", "--hostfile", cluster.hostfile, "--np", "3"),
             timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"{cluster.hostfile}: 3 host(s), 3 slot(s), 3 rank(s) fit" in ok.stdout
    short = run(on(cluster, "h1", os.path.join(BIN, "ringtrain"), "doctor", "--hostfile", cluster.hostfile,
                   "--np", "4"), timeout=120)
    problems = [line for line in short.stdout.splitlines() if line.startswith("PROBLEM")]
    assert short.returncode == 1 and len(problems) == 1 and "but 4 are needed" in problems[0], short.stdout


def ringtrain_pid(cluster, host):
    """The PID of the elastic ringtrain rank on `host`."""
    return pid_on(cluster, host, lambda argv: any(w.endswith("/ringtrain") for w in argv[:2]) and "--elastic" in argv)


@pytest.mark.parametrize("change", ["rank killed", "host removed", "host added"])
def test_elastic_ring_goes_on_when_a_rank_is_lost_or_a_host_comes_or_goes(cluster, tmp_path, change):
    """--elastic under horovodrun --gloo's elastic mode, h1..h3 from a discovery script
    that reads a file: training goes on at the new rank count, to identical weights."""
    hosts_file = tmp_path / "elastic-hosts"
    hosts_file.write_text("h1:1\nh2:1\n" if change == "host added" else "h1:1\nh2:1\nh3:1\n")
    discover = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "mpi_hostfiles", "discover_hosts.sh"))
    weights_path = str(tmp_path / "w-{rank}.npz")
    start = 2 if change == "host added" else 3
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("elastic", on(cluster, "h1", "env", f"RINGTRAIN_ELASTIC_HOSTS={hosts_file}",
                                  os.path.join(BIN, "horovodrun"), "--gloo", "-np", str(start), "--min-np", "2",
                                  "--max-np", "3", "--host-discovery-script", discover,
                                  # the survivor whose peer died first waits this long for it (default 30 s)
                                  "--gloo-timeout-seconds", "15",
                                  os.path.join(BIN, "ringtrain"), "--elastic", "--commit-every", "5",
                                  "--model", "mnist_mlp", "--steps", "400", *DETERMINISTIC, "--log-every", "10",
                                  "--dump-weights", weights_path))
        tasks.wait_for_text("elastic", "step 30/400", timeout=180)
        if change == "rank killed":
            victim = ringtrain_pid(cluster, "h3")
            assert victim, "no ringtrain rank on h3"
            os.kill(victim, signal.SIGKILL)
        else:
            hosts_file.write_text("h1:1\nh2:1\n" if change == "host removed" else "h1:1\nh2:1\nh3:1\n")
        assert tasks.wait("elastic", 180) == 0, tasks.log("elastic")[-3000:]
        log = tasks.log("elastic")
    summary = last_json(log)
    end = 3 if change == "host added" else 2
    assert summary["steps"] == 400 and summary["elastic"]["world_sizes"] == [start, end], summary.get("elastic")
    assert summary["world_size"] == end and sorted(summary["hosts"]) == ["h1", "h2", "h3"][:end]
    dumped = [weights(weights_path, rank) for rank in range(end)]
    for other in dumped[1:]:
        assert_same_weights(dumped[0], other, exact=True)
    assert_no_process_left_on_any_host(cluster)
