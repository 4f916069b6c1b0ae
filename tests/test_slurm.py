"""A real SLURM (Debian's Slurm 22.05: munged and slurmd on every simulated
host, slurmctld on h1), and the repo's own sbatch files submitted to it:
ring mode by mpirun inside the allocation and by srun through PMIx, TF's
collective mode and PS mode by a plain srun, the scaling bench on the
allocation's nodes. scancel leaves no process on any host, and a node whose
processes all die ends its job with SLURM's line naming it."""
import os
import re
import signal
import time

import pytest

from ringtrain.multihost import simcluster, slurm
from ringtrain.common.errors import UsageError
from helpers import (ONE_THREAD, REPO, Tasks, assert_checkpoint_is_one_process_on_the_global_batch, assert_same_weights,
                     last_json, mpirun, run_ok, wait_until, weights)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
SBATCH = os.path.join(REPO, "mpi_hostfiles", "slurm")
TRAIN = ["--model", "mnist_mlp", "--batch-size", "16", "--log-every", "10", *ONE_THREAD]
RUNNING = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"}
# What SLURM itself runs on a host; anything else there belongs to a job.
DAEMONS = ("sshd", "munged", "slurmd", "slurmctld")


def slurm_cluster(name, hosts=2):
    try:
        simcluster.check_can_build()
        slurm.check_installed()
    except UsageError as e:
        pytest.skip(f"no simulated SLURM cluster here: {e}")
    return simcluster.up(name, hosts, simcluster.Link("10gbit"), log=lambda line: None, slurm=True)


@pytest.fixture(scope="module")
def nodes():
    name = f"rts{os.getpid() % 100000}"
    built = slurm_cluster(name)
    try:
        yield built
    finally:
        simcluster.down(name, quiet=True)


def on_h1(cluster, argv, folder, timeout=60):
    """argv run on h1 (where SLURM's commands find their controller), in folder."""
    return run_ok(simcluster.enter_argv(cluster, "h1", argv, cwd=str(folder)), timeout=timeout)


def submit(cluster, script, folder, *args, sbatch=()):
    """sbatch one of the repo's scripts; its job ID. The job inherits this
    environment (the venv's PATH), as `sbatch` from an activated venv does."""
    out = on_h1(cluster, ["sbatch", "--parsable", f"--output={folder}/job-%j.out", *sbatch,
                          os.path.join(SBATCH, script), *args], folder)
    return out.strip().split(";")[0]


def state(cluster, job):
    out = on_h1(cluster, ["scontrol", "show", "job", "-o", job], "/")
    return re.search(r"JobState=(\S+)", out).group(1)


def wait_for_end(cluster, job, folder, timeout=240):
    """(final state, the job's output), polling scontrol: `sbatch --wait`
    polls far more slowly."""
    deadline = time.monotonic() + timeout
    while (now := state(cluster, job)) in RUNNING:
        assert time.monotonic() < deadline, f"job {job} still {now} after {timeout}s:\n{output(folder, job)[-3000:]}"
        time.sleep(0.5)
    return now, output(folder, job)


def output(folder, job):
    path = os.path.join(folder, f"job-{job}.out")
    return open(path).read() if os.path.exists(path) else ""


def completed(cluster, job, folder, timeout=240):
    final, text = wait_for_end(cluster, job, folder, timeout)
    assert final == "COMPLETED", (f"job {job} ended {final}:\n{text[-4000:]}\n"
                                  + on_h1(cluster, ["scontrol", "show", "job", job], "/") + daemon_lines(cluster, job))
    return text


def daemon_lines(cluster, job):
    """What slurmctld and each slurmd logged about a job: why it ended as it did."""
    found = []
    for name, path in slurm.log_files(cluster).items():
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                found += [f"{name}: {line.rstrip()}" for line in f if re.search(rf"\b{job}\b", line)]
    return "\n".join(found[-60:])


def job_processes(cluster):
    """{host: [command line]} of every process on a host that is not SLURM's or sshd."""
    found = {}
    for host in cluster.hosts:
        for pid in simcluster.processes_in(host.netns):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if argv and os.path.basename(argv.split()[0]).rstrip(":") not in DAEMONS:
                found.setdefault(host.name, []).append(argv)
    return found


def jobs_left_after(cluster, seconds=15):
    """job_processes once they are gone, or after `seconds` (slurmstepd reaps the last of them)."""
    deadline = time.monotonic() + seconds
    while (left := job_processes(cluster)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.mark.parametrize("script", ["ring.sbatch", "ring-srun.sbatch"])
def test_ring_mode_by_mpirun_in_sbatch_and_by_srun_runs_on_every_node(nodes, tmp_path, script):
    job = submit(nodes, script, tmp_path, *TRAIN, "--steps", "20", "--summary-json", f"{tmp_path}/s.json")
    completed(nodes, job, tmp_path)
    summary = last_json(open(tmp_path / "s.json").read())
    assert summary["hosts"] == ["h1", "h2"] and summary["world_size"] == 2 and summary["steps"] == 20


def test_tf_collective_mode_by_a_plain_srun_runs_on_every_node(nodes, tmp_path):
    job = submit(nodes, "tf-collective.sbatch", tmp_path, *TRAIN, "--steps", "20",
                 "--summary-json", f"{tmp_path}/s.json")
    completed(nodes, job, tmp_path)
    summary = last_json(open(tmp_path / "s.json").read())
    assert summary["mode"] == "tf-collective" and summary["hosts"] == ["h1", "h2"]


def test_sync_ps_by_srun_equals_one_process_on_the_global_batch(nodes, tmp_path):
    """1 PS and 2 workers, each task taking its job from its SLURM rank."""
    steps, lr, batch = 4, 0.1, 8
    job = submit(nodes, "ps.sbatch", tmp_path, "--num-ps", "1", "--sync", "--optimizer", "sgd", "--lr", str(lr),
                 "--no-dropout", "--steps", str(steps), *TRAIN, "--batch-size", str(batch),
                 "--checkpoint-dir", str(tmp_path / "ckpt"))
    text = completed(nodes, job, tmp_path)
    assert "tasks by srun rank: 0 ps:0 (h1:8888), 1 worker:0 (h1:8889), 2 worker:1 (h2:8888)" in text
    assert last_json(text)["mode"] == "ps-sync"
    assert_checkpoint_is_one_process_on_the_global_batch(str(tmp_path / "ckpt"), steps, lr, batch, workers=2)


def test_async_ps_by_srun_learns(nodes, tmp_path):
    job = submit(nodes, "ps.sbatch", tmp_path, "--num-ps", "1", *TRAIN, "--steps", "60")
    summary = last_json(completed(nodes, job, tmp_path))
    assert summary["mode"] == "ps-async" and summary["reporting_workers"] == [0, 1]
    assert summary["test_accuracy"] > 0.7  # chance is 0.1


def test_the_scaling_bench_in_an_allocation_runs_on_its_nodes(nodes, tmp_path):
    import json
    job = submit(nodes, "bench.sbatch", tmp_path, "--np", "1,2", "--modes", "ring", "--model", "mnist_mlp",
                 "--steps", "8", "--warmup-steps", "2", "--batch-size", "32", "--optimizer", "sgd",
                 "--out", str(tmp_path / "r"))
    text = completed(nodes, job, tmp_path, timeout=300)
    assert f"on the nodes of SLURM job {job} (h1, h2)" in text
    result = json.loads((tmp_path / "r" / "scaling.json").read_text())
    assert {r["workers"]: r["hosts"] for r in result["rows"]} == {1: 1, 2: 2}
    assert result["alpha_beta"]  # fitted on these nodes' links


def test_scancel_leaves_no_process_on_any_host(nodes, tmp_path):
    job = submit(nodes, "ring.sbatch", tmp_path, *TRAIN, "--steps", "100000")
    deadline = time.monotonic() + 120
    while not all("ringtrain" in " ".join(job_processes(nodes).get(h.name, [])) for h in nodes.hosts):
        assert state(nodes, job) in RUNNING and time.monotonic() < deadline, output(tmp_path, job)[-3000:]
        time.sleep(0.5)
    on_h1(nodes, ["scancel", job], tmp_path)
    final, _ = wait_for_end(nodes, job, tmp_path, timeout=60)
    assert final == "CANCELLED"
    assert jobs_left_after(nodes) == {}


def test_a_dead_node_ends_its_job_with_a_line_naming_it(tmp_path):
    """Every process of h2 (its sshd, munged, slurmd and the job's task) is
    killed: SLURM marks h2 down and ends the job, and srun names the node."""
    name = f"rtd{os.getpid() % 100000}"
    dying = slurm_cluster(name)
    try:
        job = submit(dying, "ring-srun.sbatch", tmp_path, *TRAIN, "--steps", "100000", sbatch=["--no-requeue"])
        deadline = time.monotonic() + 120
        while "epoch" not in output(tmp_path, job):
            assert state(dying, job) in RUNNING and time.monotonic() < deadline, output(tmp_path, job)[-3000:]
            time.sleep(0.5)
        for pid in simcluster.processes_in(dying.host("h2").netns):
            os.kill(pid, signal.SIGKILL)
        final, text = wait_for_end(dying, job, tmp_path, timeout=120)
        assert final == "NODE_FAIL", text[-3000:]
        assert "srun: error: Node failure on h2" in text
        assert slurm.node_states(dying)["h2"].startswith("down")
        assert "h1" not in jobs_left_after(dying)  # nothing of the job is left on the node that lived
    finally:
        simcluster.down(name, quiet=True)
    assert not [ns for ns in os.listdir("/run/netns") if ns.startswith(f"{name}-")]


# --- preemption: scancel --signal, the job's own requeue, and a resume that equals a run never stopped ---------

DETERMINISTIC = ["--model", "mnist_cnn", "--batch-size", "16", "--optimizer", "sgd", "--lr", "0.05", "--no-dropout",
                 "--log-every", "10", "--checkpoint-every", "100000", *ONE_THREAD]
PREEMPTED_STEPS = 120  # the signal after step 30 stops the first run within a few steps (34 on an idle machine)


def wait_for_output(cluster, job, folder, pattern, timeout=180):
    deadline = time.monotonic() + timeout
    while not re.search(pattern, output(folder, job)):
        assert state(cluster, job) in RUNNING and time.monotonic() < deadline, output(folder, job)[-3000:]
        time.sleep(0.3)


@pytest.mark.parametrize("script,words,baseline", [
    ("ring.sbatch", [], lambda args: mpirun(2, *args)),
    ("tf-collective.sbatch", [], lambda args: mpirun(2, "--backend", "tf-collective", *args)),
    ("ps.sbatch", ["--num-ps", "1", "--replication", "in-graph"],
     lambda args: [os.path.join(os.path.dirname(os.sys.executable), "ps-baseline"), "launch", "--num-ps", "1",
                   "--num-workers", "2", "--replication", "in-graph", *args]),
], ids=["ring", "tf-collective", "ps-in-graph"])
def test_scancel_signal_stops_a_job_which_requeues_itself_and_ends_as_if_never_stopped(nodes, tmp_path, script,
                                                                                       words, baseline):
    """`scancel --signal=USR1` (what `sbatch --signal` sends before the time
    limit) reaches every task: the job stops at an agreed step within SLURM's
    30 s, saves, requeues itself (its script does, on exit 75), comes back with
    the same ID, resumes from its own checkpoint and ends with the weights of
    a run that was never stopped (here, the same command under a plain launcher)."""
    dump = str(tmp_path / "w-{rank}.npz")
    ntasks = ["--ntasks=3"] if script == "ps.sbatch" else []
    args = [*DETERMINISTIC, "--steps", str(PREEMPTED_STEPS)]
    with Tasks(str(tmp_path)) as tasks:
        tasks.start("whole", baseline([*args, "--dump-weights", dump.replace("w-", "whole-")]))
        job = submit(nodes, script, tmp_path, *words, *args, "--checkpoint-dir", str(tmp_path / "ckpt"),
                     "--dump-weights", dump, sbatch=["--open-mode=append", *ntasks])
        wait_for_output(nodes, job, tmp_path, r"\bstep 30/")
        signalled = time.monotonic()
        on_h1(nodes, ["scancel", "--signal=USR1", job], tmp_path)
        wait_for_output(nodes, job, tmp_path, r"requeueing it")
        seconds = time.monotonic() - signalled
        print(f"{script}: from scancel --signal to the requeue line: {seconds:.1f} s")  # (shown with pytest -s)
        # SLURM holds a requeued job back for two minutes (its BeginTime, the first run's credential's
        # lifetime); the test need not wait them, but its first run (slurmstepd too) must be gone from every
        # node first, and it must start again in a later second than the one its credential was revoked in:
        # slurmd compares the two in whole seconds, and a requeued job let start in the same second ended
        # FAILED without running ("Killing non-startable batch JobId=8: Job credential revoked", RunTime 0)
        wait_until(lambda: "Reason=BeginTime" in on_h1(nodes, ["scontrol", "show", "job", "-o", job], "/"), 60)
        assert not (left := jobs_left_after(nodes, 60)), left
        on_h1(nodes, ["scontrol", "update", f"JobId={job}", "StartTime=now+2"], tmp_path)
        text = completed(nodes, job, tmp_path, timeout=300)
        assert tasks.wait("whole", 240) == 0, tasks.log("whole")[-3000:]
    stopped = [line for line in text.splitlines() if ": stopped by " in line]
    # (rank 0 is mpirun's own child, in the batch step, which scancel --signal leaves alone: it learns from
    # the others, and names no signal of its own)
    assert len(stopped) == 1 and seconds < 30, (seconds, text[-4000:])
    assert "holds this run's own checkpoints" in text  # the requeued job resumed by itself
    assert_same_weights(weights(dump, 0), weights(dump.replace("w-", "whole-"), 0))
