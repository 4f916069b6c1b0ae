"""Helpers for the PS tests: start single tasks of `ps-baseline` as the seeds
do (one process per task, each in its own process group) and stop them."""
import os
import subprocess
import sys
import time

from conftest import ENV, ONE_THREAD, REPO, free_port, kill_group

PS_BASELINE = [sys.executable, "-m", "ps_baseline.cli"]
TINY = ["--model", "mnist_mlp", "--batch-size", "16", "--log-every", "5", *ONE_THREAD]


def hosts(count):
    return ",".join(f"localhost:{free_port()}" for _ in range(count))


def task_args(ps_hosts, worker_hosts, job, index, *extra):
    return [*PS_BASELINE, f"--ps_hosts={ps_hosts}", f"--worker_hosts={worker_hosts}",
            f"--job_name={job}", f"--task_index={index}", *extra]


class Tasks:
    """Started tasks, each logging to its own file; all killed on exit."""

    def __init__(self, folder):
        self.folder, self.procs = folder, {}

    def start(self, name, argv):
        log = open(os.path.join(self.folder, f"{name}.log"), "w")
        self.procs[name] = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        return self.procs[name]

    def log(self, name):
        with open(os.path.join(self.folder, f"{name}.log")) as f:
            return f.read()

    def wait(self, name, timeout):
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {timeout}s:\n{self.log(name)[-3000:]}")

    def wait_for_text(self, name, text, timeout):
        deadline = time.monotonic() + timeout
        while text not in self.log(name):
            assert self.procs[name].poll() is None, f"{name} exited:\n{self.log(name)[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} from {name}:\n{self.log(name)[-3000:]}"
            time.sleep(0.2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for proc in self.procs.values():
            kill_group(proc)
