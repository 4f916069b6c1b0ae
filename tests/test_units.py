"""Fast specifications of small pieces: resume positions, the learning-rate
recipe, what the PS launcher hands its tasks and where it puts them,
staleness, the shared summary and console."""
import argparse
import io
import json

import pytest

from ps_baseline import launcher
from ps_baseline.reports import Staleness, staleness_fields
from ringtrain.workloads.checkpoints import Progress
from ringtrain.workloads.horovod_env import allreduce_algorithm_in_effect, controller_in_effect, cpu_operations_env
from ringtrain.workloads.schedule import learning_rate_schedule
from ringtrain.workloads.console import Console, human_summary
from ringtrain.workloads.evaluation import Evaluation
from ringtrain.workloads.gradients import ring_buckets
from ringtrain.workloads.summary import build_summary


# --- resume positions -----------------------------------------------------------

def test_progress_after_a_whole_epoch_points_at_the_next_one():
    assert Progress.at(step=63, epoch=0, batches_done=63, per_epoch=63, size=2, batch_size=32) == Progress(63, 1, 0)


def test_progress_counts_global_samples_so_any_rank_count_can_resume():
    saved = Progress.at(step=6, epoch=0, batches_done=6, per_epoch=125, size=2, batch_size=16)
    assert saved.samples_in_epoch == 192
    assert saved.batches_done(size=1, batch_size=32) == 6   # 1 rank x 32
    assert saved.batches_done(size=3, batch_size=16) == 4   # 3 ranks x 16


def test_progress_rounds_to_the_nearest_global_batch_when_sizes_do_not_divide():
    saved = Progress(step=6, epoch=0, samples_in_epoch=192)
    assert saved.batches_done(size=5, batch_size=16) == 2   # 2.4 batches: 32 samples seen again
    assert saved.batches_done(size=1, batch_size=128) == 2  # 1.5 rounds to even: 64 samples skipped


# --- learning rate ----------------------------------------------------------------

def test_lr_ramps_linearly_from_the_single_worker_lr_to_n_times_it():
    lr_at = learning_rate_schedule(0.01, size=4, steps_per_epoch=100)
    assert lr_at(0) == pytest.approx(0.01)
    assert lr_at(50) == pytest.approx(0.025)
    assert lr_at(100) == lr_at(10_000) == pytest.approx(0.04)


def test_lr_is_not_scaled_with_adasum_or_when_asked_not_to():
    from ringtrain.cli import parser
    from ringtrain.train import horovod_config
    for flags in (["--adasum"], ["--no-lr-scaling"]):
        horovod = horovod_config(parser().parse_args(flags))
        lr_at = learning_rate_schedule(0.01, 4, 100, scale=horovod.lr_scaling, warmup_epochs=horovod.warmup_epochs)
        assert lr_at(500) == pytest.approx(0.01)


def test_lr_without_warmup_is_scaled_from_the_first_step():
    assert learning_rate_schedule(0.01, size=2, steps_per_epoch=100, warmup_epochs=0)(0) == pytest.approx(0.02)


# --- the PS launcher --------------------------------------------------------------

def test_launcher_hands_tasks_the_users_own_words_less_its_own():
    argv = ["--num-ps", "2", "--num-workers=3", "--sync", "--model", "mnist_mlp", "--summary-json", "s.json",
            "--is_sync=True", "--hostfile", "hosts", "--lr", "0.1"]
    assert launcher.task_words(argv) == ["--sync", "--model", "mnist_mlp", "--is_sync=True", "--lr", "0.1"]


def test_launcher_fills_worker_slots_host_by_host_and_spreads_ps_from_the_second_host():
    from ringtrain.multihost.hostfile import Host
    hosts = [Host("h1", 2), Host("h2", 2), Host("h3", 1)]
    tasks = {t.name: t.host for t in launcher.place(3, 4, False, hosts, "hf")}
    assert [tasks[f"worker{i}"] for i in range(4)] == ["h1", "h1", "h2", "h2"]
    assert [tasks[f"ps{i}"] for i in range(3)] == ["h2", "h3", "h1"]


# --- staleness, summary, console ---------------------------------------------------

def test_staleness_counts_other_updates_between_read_and_apply():
    s = Staleness()
    s.add(read_step=10, applied_step=11)  # only our own update: fresh
    s.add(read_step=11, applied_step=14)  # two others landed in between
    assert s.as_list() == [2, 2, 2]
    assert s.histogram == {"0": 1, "2": 1}
    reports = [{"staleness": s.as_list(), "staleness_histogram": s.histogram},
               {"staleness": [0, 2, 0], "staleness_histogram": {"0": 2}}]
    assert staleness_fields(reports) == {"staleness_mean": 0.5, "staleness_max": 2, "staleness_p50": 0,
                                         "staleness_p99": 2, "staleness_histogram": {"0": 3, "2": 1}}


def test_every_mode_builds_the_same_summary_with_its_own_fields_added():
    from ringtrain.workloads.config import ModelConfig, RunConfig
    config = RunConfig(ModelConfig("mnist_mlp"), None, None, None, flags={"data": "mnist", "lr": 0.1,
                                                                            "model": "mnist_mlp"})
    dataset = argparse.Namespace(where="embedded")
    report = {"samples": 640.0, "seconds": 2.0, "windows": [320.0], "step_time_sec": 0.1,
              "window_spans_unix": [[0.0, 2.0, 640.0]]}
    summary = build_summary("ps-sync", config, dataset, world_size=2, steps=20, epochs=0.5, train_loss=0.3,
                            evaluation=Evaluation(90.0, 30.0, 100), wall_seconds=3.0, reports=[report, report],
                            num_ps=1)
    assert summary["test_accuracy"] == 0.9 and summary["test_loss"] == 0.3
    assert summary["images_per_sec"] == 640.0  # 1280 samples over the slowest worker's 2 s
    assert summary["num_ps"] == 1 and summary["config"] == {"data": "mnist", "lr": 0.1, "model": "mnist_mlp"}
    # a worker that timed no step (a backup worker's peers can make every update) is not measured,
    # which is not 0 img/s
    idle = dict(report, samples=0.0, seconds=0.0, windows=[])
    summary = build_summary("ps-sync", config, dataset, world_size=2, steps=20, epochs=0.5, train_loss=0.3,
                            evaluation=Evaluation(90.0, 30.0, 100), wall_seconds=3.0, reports=[report, idle])
    assert summary["images_per_sec_per_worker"] == [320.0, None] and summary["images_per_sec"] == 320.0


def test_console_ends_with_a_human_summary_then_the_json_line():
    out = io.StringIO()
    summary = {"mode": "ring", "model": "mnist_cnn", "steps": 40, "epochs": 0.6, "wall_time_sec": 12.5,
               "world_size": 2, "test_accuracy": 0.912, "test_samples": 1000, "test_loss": 0.31,
               "train_loss": 0.4, "images_per_sec": 2345.6, "checkpoint": "ckpt/ckpt-40"}
    Console(stream=out, bar=False).finish(summary)
    lines = out.getvalue().splitlines()
    assert lines[:-1] == human_summary(summary)
    assert "test accuracy 91.20 %" in lines[1] and "2,346 img/s" in lines[2] and "ckpt/ckpt-40" in lines[3]
    assert json.loads(lines[-1])["steps"] == 40


def test_console_draws_a_bar_in_place_on_a_terminal_and_lines_otherwise():
    bar, plain = io.StringIO(), io.StringIO()
    for out, is_terminal in ((bar, True), (plain, False)):
        console = Console(stream=out, bar=is_terminal)
        console.progress(5, 10, "step 5/10 loss 1.0")
        console.progress(10, 10, "step 10/10 loss 0.5")
    assert bar.getvalue().count("\r") == 2 and bar.getvalue().endswith("\n")
    assert plain.getvalue().splitlines() == ["step 5/10 loss 1.0", "step 10/10 loss 0.5"]


# --- across hosts: ssh command lines and hostfiles ----------------------------------

def test_ssh_command_line_quotes_every_word_and_takes_only_host_names():
    import shlex
    from ringtrain.multihost import procs
    argv = ["python", "-c", "print(1)", "$(reboot)", "a;b", "it's"]
    ssh = procs.ssh_argv("h2", argv, cwd="/tmp/with space")
    assert ssh[ssh.index("--") + 1] == "h2"  # the host is one word, after --
    remote = shlex.split(ssh[-1])  # what the remote shell hands the guard, word for word
    assert remote[-len(argv):] == argv and remote[remote.index("--cwd") + 1] == "/tmp/with space"
    for bad in ("-oProxyCommand=touch x", "h1;reboot", "h1 h2", "$(x)", ""):
        with pytest.raises(ValueError):
            procs.ssh_argv(bad, argv)


# A task that exits 75 on SIGTERM, once it says it is ready.
ON_SIGTERM_75 = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(75)); "
                 "print('ready', flush=True); time.sleep(60)")


def test_a_frozen_task_that_is_stopped_acts_on_its_sigterm_and_is_not_killed():
    """SIGSTOP holds a pending SIGTERM; the SIGCONT after it lets the task end as it would
    (locally, and under the remote guard), not by the SIGKILL after the grace."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time
    from ringtrain.multihost import guard, procs

    def frozen(pid, said):
        while "ready" not in said():
            time.sleep(0.05)
        os.killpg(pid, signal.SIGSTOP)

    task = procs.Process([sys.executable, "-c", ON_SIGTERM_75], capture=True)
    frozen(task.pid, lambda: "".join(task.stdout))
    task.stop(grace=30)
    assert task.returncode == 75
    child = subprocess.Popen([sys.executable, "-c", ON_SIGTERM_75], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    frozen(child.pid, child.stdout.readline)
    reaped = threading.Thread(target=child.wait)  # (as the guard's own waits on its command)
    reaped.start()
    guard.end_group(child.pid, grace=30)
    reaped.join()
    assert child.returncode == 75


def test_hostfile_lines_are_read_as_openmpi_does(tmp_path):
    from ringtrain.multihost.hostfile import Host, fill, read_hostfile
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nlocalhost slots=2 max_slots=4\n\n127.0.0.1   # one slot by default\n"
                    "localhost slots=1\n")
    hosts = read_hostfile(str(path))
    assert hosts == [Host("localhost", 3), Host("127.0.0.1", 1)]
    assert fill(hosts, 4) == ["localhost"] * 3 + ["127.0.0.1"]


@pytest.mark.parametrize("text,expected", [
    ("node1:4\n", "line 1 ('node1:4'): 'node1:4' is not a host name; write `host slots=N`"),
    ("localhost slots=two\n", "line 1 ('localhost slots=two'): expected `localhost slots=N` with N >= 1"),
    ("localhost\nh1;reboot slots=1\n", "line 2"),
    ("no-such-host-rt.invalid slots=1\n", "unknown host 'no-such-host-rt.invalid' (it does not resolve here)"),
    ("# nothing\n", "names no host"),
])
def test_a_bad_hostfile_is_one_error_naming_the_line_and_the_fix(tmp_path, text, expected):
    from ringtrain.multihost.hostfile import read_hostfile
    from ringtrain.common.errors import UsageError
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(UsageError, match=None) as caught:
        read_hostfile(str(path))
    assert expected in str(caught.value) and str(path) in str(caught.value)


def test_too_few_slots_says_how_many_there_are_and_are_needed():
    from ringtrain.multihost.hostfile import Host, fill
    from ringtrain.common.errors import UsageError
    with pytest.raises(UsageError, match=r"has 2 slot\(s\) \(h1 slots=1, h2 slots=1\) but 3 are needed"):
        fill([Host("h1", 1), Host("h2", 1)], 3, "hf")


@pytest.mark.parametrize("environ, choice, expected", [
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "HOROVOD_GLOO_IFACE": "eth0"}, "auto",
     "gloo"),                                                                             # 2 hosts
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "auto", "mpi"),    # one host
    ({"SLURM_STEP_NUM_NODES": "3", "HOROVOD_GLOO_IFACE": "eth0"}, "auto", "gloo"),
    ({}, "auto", "mpi"),                                                                  # nothing said
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "mpi", "mpi"),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "gloo", "gloo"),
    ({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "h1"}, "auto", None),                               # horovodrun --gloo
])
def test_gloo_carries_the_gradients_under_mpirun_when_ranks_span_hosts(environ, choice, expected):
    env = cpu_operations_env(choice, environ)
    assert env.get("HOROVOD_CPU_OPERATIONS") == expected
    assert env.get("HOROVOD_CONTROLLER") == expected  # what carries the tensors coordinates too
    if expected:  # (the summary's names for them)
        assert allreduce_algorithm_in_effect(expected, dict(environ, **env)).startswith(expected)
        assert controller_in_effect(True, dict(environ, **env)) == expected


def test_gloos_timeout_under_mpirun_outlasts_the_stall_watchdog():
    from ringtrain.workloads.horovod_env import gloo_timeout_env
    gloo = {"HOROVOD_CONTROLLER": "gloo"}
    assert gloo_timeout_env(120, gloo) == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "130"}
    assert gloo_timeout_env(0, gloo) == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "86400"}  # watchdog off: no 30 s end
    assert gloo_timeout_env(120, {"HOROVOD_CONTROLLER": "mpi"}) == {}
    assert gloo_timeout_env(120, dict(gloo, HOROVOD_GLOO_RENDEZVOUS_ADDR="h1")) == {}  # horovodrun's own


def test_a_users_own_data_path_sets_the_controller_too():
    spans = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "HOROVOD_GLOO_IFACE": "eth0"}
    env = cpu_operations_env("auto", dict(spans, HOROVOD_CPU_OPERATIONS="MPI"))
    assert env == {"HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_CONTROLLER": "mpi"}
    assert controller_in_effect(True, {}) == "mpi" and controller_in_effect(False, {}) == "gloo"


def test_auto_keeps_openmpis_path_where_this_hosts_name_resolves_to_loopback(monkeypatch):
    import socket
    spans = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1")  # Debian's /etc/hosts
    assert cpu_operations_env("auto", spans)["HOROVOD_CPU_OPERATIONS"] == "mpi"
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "198.18.0.2")
    assert cpu_operations_env("auto", spans)["HOROVOD_CPU_OPERATIONS"] == "gloo"


def test_ring_buckets_group_small_gradients_last_layers_first_and_leave_a_large_one_alone():
    # mnist_cnn's 8 gradients (bytes, the model's order) in 0.5 MB buckets: its 4.72 MB dense kernel alone,
    # in place; the small ones in the order backprop makes them, until a bucket holds 0.5 MB (these 80 KB
    # never do: one bucket, after backprop, and one Horovod round fewer a step)
    sizes = [1_152, 128, 73_728, 256, 4_718_592, 512, 5_120, 40]
    assert ring_buckets(sizes, 2**19) == [[7, 6, 5, 3, 2, 1, 0], [4]]
    assert ring_buckets([300_000, 300_000, 300_000], 2**19) == [[2, 1], [0]]
    assert ring_buckets(sizes, 0) == [[i] for i in reversed(range(8))]  # 0: each alone
    assert ring_buckets([float("inf"), 10], 100) == [[1], [0]]  # a sparse gradient, alone


# --- memory between steps --------------------------------------------------------

def test_a_steps_freed_megabytes_are_reused_not_faulted_in_again():
    """tfenv.keep_freed_memory, as every process that loads TF runs it: a
    "step" of three blocks (8, 8 and 3 MB) live at once and freed together, 20
    times, pages nothing in again, where glibc's defaults return the freed top
    of the heap to the kernel and fault it back in each time (35,339 page
    faults in 20 steps here)."""
    import resource
    import numpy as np
    from ringtrain.workloads.tfenv import keep_freed_memory

    def step():
        return [np.ones(size << 20, np.uint8) for size in (8, 8, 3)]
    keep_freed_memory()
    step()  # (the first pages them in)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 2048


def test_a_collective_whose_peer_is_gone_is_told_from_any_other_error():
    from ringtrain.train import peer_gone
    gloo = ("Graph execution error:\n\nDetected at node HorovodGroupedAllreduce_0\n  File ...\n\n"
            "[/tmp/tmp.x/horovod-0.28.1/third_party/compatible17_gloo/gloo/transport/tcp/pair.cc:598] "
            "Connection closed by peer [198.18.156.1]:59276\n\t [[{{node HorovodGroupedAllreduce_0}}]]")
    assert peer_gone(gloo) == "Gloo: Connection closed by peer [198.18.156.1]:59276"
    assert peer_gone("Horovod has been shut down. This was caused by an exception on one of the ranks") == \
        "Horovod has been shut down"
    assert peer_gone("Incompatible shapes: [64,10] vs. [32,10]") is None


def test_a_rank_waits_for_its_launchers_stop_signal_and_no_longer():
    import os
    import signal
    import time

    from ringtrain.workloads.preemption import Preemption
    waiting = Preemption()
    started = time.monotonic()
    assert waiting.wait(0.3) is False and 0.3 <= time.monotonic() - started < 2
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        waiting.install("test")
        waiting.defer()  # training: a signal is recorded, not acted on
        os.kill(os.getpid(), signal.SIGUSR1)
        started = time.monotonic()
        assert waiting.wait(30) is True and time.monotonic() - started < 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- the tests' second launch after TF2 PS's refused fetch ----------------------

def test_only_tf2_ps_refused_fetch_gets_a_second_launch_and_after_the_reset():
    from types import SimpleNamespace
    from helpers import TF_FETCH_FLAKE, once_more_after_tf_fetch_flake
    calls = []

    def launch(said):
        texts = iter(said)  # what each launch says, in turn

        def attempt():
            calls.append("launch")
            text = next(texts)
            assert not text.startswith("exited"), text  # as Tasks.wait_for_text fails on an early exit
            return SimpleNamespace(returncode=int(text != "done"), stdout=text, stderr="")
        return attempt

    def reset():
        calls.append("reset")

    assert once_more_after_tf_fetch_flake(launch([f"error: {TF_FETCH_FLAKE}", "done"]), reset).stdout == "done"
    assert calls == ["launch", "reset", "launch"]
    calls.clear()
    assert once_more_after_tf_fetch_flake(launch([f"exited: {TF_FETCH_FLAKE}", "done"]), reset).stdout == "done"
    assert calls == ["launch", "reset", "launch"]
    calls.clear()
    assert once_more_after_tf_fetch_flake(launch(["error: worker 1 died", "done"]), reset).returncode == 1
    assert calls == ["launch"]
    calls.clear()
    with pytest.raises(AssertionError, match="worker 1 died"):
        once_more_after_tf_fetch_flake(launch(["exited: worker 1 died", "done"]), reset)
    assert calls == ["launch"]
