"""`ps-baseline launch`: a whole PS cluster, one process per task, as if each
had been started in its own terminal: on this machine, or on the hosts of an
OpenMPI hostfile, each task started over ssh.

Tasks get free ports on their hosts and are started as argument lists
(multihost.procs); their output comes back here prefixed with [task], or
[host task] across hosts. Every task receives the user's own flag words, less
the launcher's. If any task fails, or on Ctrl-C, every task on every host is
stopped. The exit status is the chief's, and the last stdout line is the
chief's JSON summary.
"""
import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from ringtrain.multihost import hostfile, procs
from ringtrain.multihost.private_net import PrivateNetwork
from ps_baseline import losses
from ps_baseline.losses import NO_RESTARTS_ENV
from ps_baseline.options import EXPOSURE_SAID_ENV, PROG, add_mode_flags, check_mode, ps_config
from ps_baseline.servers import TASK_DATA_ENV
from ringtrain.workloads.console import PROGRESS_AS_DATA_ENV, Console
from ringtrain.common.errors import EXIT_PREEMPTED, EXIT_STOPPED, UsageError
from ringtrain.common.parsing import add_version, positive_int
from ringtrain.workloads.flags import OneLineParser, add_training_flags, load_training_data
from ringtrain.workloads.outputs import check_outputs
from ringtrain.workloads.preemption import SIGNALS as PREEMPTION_SIGNALS
from ringtrain.workloads.summary import FULL_SUMMARY_LINE_ENV

WORKERS_GRACE_SEC = 60  # after the chief is done, time for the others to finish
MAX_RESTARTS = 3        # --restart-workers: per worker, so that a worker that always dies does not loop

EXAMPLE = f"""\
examples:
  {PROG} launch --num-ps 2 --num-workers 2 --sync --model mnist_cnn --epochs 5
  {PROG} launch --num-ps 2 --num-workers 2 --model mnist_cnn --epochs 5          # async
  {PROG} launch --num-ps 2 --num-workers 3 --sync --replicas-to-aggregate 2     # 1 backup worker
  {PROG} launch --num-ps 2 --num-workers 2 --placement partitioned --show-placement --steps 50
  {PROG} launch --num-ps 1 --num-workers 2 --api tf2 --epochs 1                 # ParameterServerStrategy
  {PROG} launch --hostfile hosts --num-ps 2 --num-workers 4 --sync              # across hosts, over ssh

With --hostfile, workers fill each host's slots in turn (worker 0, the chief, on
the first host); PS tasks go round-robin over the hosts, starting with the
second, so that P = hosts puts one PS beside the workers of every host.
"""


def launch_only_parser():
    """The flags the launcher reads itself; every other word goes to the tasks."""
    parser = OneLineParser(add_help=False, allow_abbrev=False)
    g = parser.add_argument_group("launch")
    g.add_argument("--num-ps", type=positive_int, default=1, metavar="P", help="PS tasks (default 1)")
    g.add_argument("--num-workers", type=positive_int, default=2, metavar="W",
                   help="worker tasks (default 2); worker 0 is the chief")
    g.add_argument("--hostfile", metavar="FILE",
                   help="OpenMPI hostfile (`host slots=N` lines): start the tasks on these hosts over ssh "
                        "(default: all on this machine)")
    g.add_argument("--summary-json", metavar="FILE", help="also write the final JSON summary to FILE")
    g.add_argument("--restart-workers", action="store_true",
                   help=f"restart a worker (not the chief) that dies, up to {MAX_RESTARTS} times each; it "
                        "rejoins where it left off. Without it, async training and sync training with backup "
                        "workers go on without a dead worker; plain sync training stops")
    return parser


def launch_parser():
    parser = OneLineParser(prog=f"{PROG} launch", epilog=EXAMPLE, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           parents=[launch_only_parser()],
                           description="Start a whole PS cluster (one process per task, on this machine "
                           "or over ssh on the hosts of a hostfile) and print the chief's JSON summary last.")
    add_version(parser)
    add_mode_flags(parser)
    add_training_flags(parser, summary_json=False)
    return parser


def task_words(argv):
    """The user's own flag words, less those only the launcher reads."""
    return launch_only_parser().parse_known_args(argv)[1]


@dataclass
class Task:
    name: str   # ps0, worker1, chief
    job: str
    index: int
    host: str
    port: int = 0

    @property
    def address(self):
        return f"{self.host}:{self.port}"


def place(num_ps, num_workers, tf2, hosts, path):
    """Tasks on hosts: workers fill the slots host by host; PS tasks go
    round-robin from the second host; the tf2 coordinator joins the first."""
    names = [h.name for h in hosts]
    tasks = [Task(f"worker{i}", "worker", i, host)
             for i, host in enumerate(hostfile.fill(hosts, num_workers, path))]
    tasks = [Task(f"ps{i}", "ps", i, names[(i + 1) % len(names)]) for i in range(num_ps)] + tasks
    if tf2:
        tasks.append(Task("chief", "chief", 0, names[0]))
    return tasks


def assign_ports(tasks):
    """A free port for every task, asked of its own host (over ssh for others)."""
    for host in dict.fromkeys(t.host for t in tasks):
        mine = [t for t in tasks if t.host == host]
        for task, port in zip(mine, procs.free_ports_on(host, len(mine))):
            task.port = port


def main(argv):
    args = launch_parser().parse_args(argv)
    check_mode(args, args.num_workers)
    # The launcher writes the summary; the chief writes checkpoints on its own host, and checks them there.
    check_outputs(argparse.Namespace(summary_json=args.summary_json) if args.hostfile else args)
    load_training_data(args, workers=args.num_workers)  # bad data flags fail here, before any task starts
    tf2 = args.api == "tf2"
    hosts = (hostfile.read_hostfile(args.hostfile) if args.hostfile
             else [hostfile.Host("localhost", args.num_workers)])
    tasks = place(args.num_ps, args.num_workers, tf2, hosts, args.hostfile or "this machine")
    assign_ports(tasks)
    address_list = lambda job: ",".join(t.address for t in tasks if t.job == job)
    cluster_words = [f"--ps_hosts={address_list('ps')}", f"--worker_hosts={address_list('worker')}"]
    if tf2:
        cluster_words.append(f"--chief_host={address_list('chief')}")
    chief = next(t for t in tasks if t.name == ("chief" if tf2 else "worker0"))

    console = Console()
    console.line(f"{PROG} launch: " + "; ".join(f"{t.name} at {t.address}" for t in tasks))
    # On one machine the tasks need loopback only: a namespace of their own keeps them unreachable.
    with PrivateNetwork() if not args.hostfile else contextlib.nullcontext(PrivateNetwork()) as net:
        console.line(f"{PROG} launch: " + exposure(net, args.hostfile))
        return run_tasks(args, argv, tasks, cluster_words, chief, console, address_list, net)


def exposure(net, across_hosts):
    """One line: where the tasks' unauthenticated gRPC servers can be reached from."""
    if net.name:
        return (f"the tasks run in a private network namespace ({net.name}) that has only loopback: their "
                f"TF gRPC servers, which take no credentials, cannot be reached from outside it")
    where = "their hosts" if across_hosts else f"this machine ({net.why_not})"
    return (f"warning: TF's gRPC servers listen on every interface of {where}, on the ports above, and run any "
            f"graph sent to them without authentication: keep those ports closed to all but the cluster's hosts")


def run_tasks(args, argv, tasks, cluster_words, chief, console, address_list, net):
    words = task_words(argv)
    output = TaskOutput(across_hosts=args.hostfile is not None, chief=chief.name, console=console)
    running, signals = {}, Signals()

    def start(task):
        argv_ = [sys.executable, "-m", "ps_baseline", *cluster_words, f"--job_name={task.job}",
                 f"--task_index={task.index}", *words]
        env = {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", EXPOSURE_SAID_ENV: "1", TASK_DATA_ENV: "1"}
        if task is chief:
            env[FULL_SUMMARY_LINE_ENV] = "1"  # its summary and its progress come back as data
            env[PROGRESS_AS_DATA_ENV] = "1"
            if not args.restart_workers:
                env[NO_RESTARTS_ENV] = "1"
        running[task.name] = procs.Process(net.wrap(argv_), name=task.name, host=task.host, cwd=os.getcwd(),
                                           env=env, on_line=output.write)

    try:
        for task in tasks:
            start(task)
        failed = watch(running, chief.name, WorkerLosses(args, tasks, chief, start, console), signals, console)
        if failed is None:
            # The chief is done: the others finish their reports, the PS tasks shut down.
            # (A worker the chief summarised without is dead or frozen: not worth waiting for.)
            reported = (output.summary or {}).get("reporting_workers")
            procs.wait_all([running[t.name] for t in tasks if t is not chief and not (
                t.job == "worker" and reported is not None and t.index not in reported)], WORKERS_GRACE_SEC)
        elif failed is running[chief.name] and (failed.returncode == EXIT_PREEMPTED or signals.deadline):
            # stopped by a signal (to any task): the chief said where, and saved; the others are ending
            procs.wait_all([p for p in running.values() if p is not failed], 5)
    finally:
        procs.stop_all(list(running.values()))
        signals.restore()

    chief_process = running[chief.name]
    # stopped by a signal: the chief saved (75), or had nowhere to (3, after a signal only); it said so
    stopped = failed is chief_process and (failed.returncode == EXIT_PREEMPTED or
                                           bool(signals.deadline) and failed.returncode == EXIT_STOPPED)
    if failed is not None and not stopped:
        where = f" on {failed.host}" if args.hostfile else ""
        sys.stderr.write(f"{PROG} launch: {failed.name}{where} {failed.describe_exit()}; stopped every "
                         f"task{' on every host' if args.hostfile else ''}\n")
        if failed.returncode == EXIT_STOPPED:  # training stopped on purpose, and the task said why
            return EXIT_STOPPED
        code = chief_process.returncode
        return code if code is not None and code > 0 else 1
    if chief_process.returncode not in (0, EXIT_PREEMPTED) and not stopped:
        return chief_process.returncode
    if output.summary is None:
        raise UsageError("the chief finished but printed no summary")
    summary = dict(output.summary, worker_devices=output.worker_devices(args.num_workers) or
                   output.summary.get("worker_devices"), launch={
        "num_ps": args.num_ps, "num_workers": args.num_workers, "hostfile": args.hostfile,
        "ps_hosts": address_list("ps").split(","), "worker_hosts": address_list("worker").split(",")})
    console.finish(summary, args.summary_json)
    return chief_process.returncode if stopped else 0


class TaskOutput:
    """Every task's lines on our stdout, prefixed with [task] or [host task].
    What tasks say as data (a JSON object on a line) is kept, not shown: what
    each task computes on; the chief's progress, drawn here (a bar on a
    terminal: a task's own output is a pipe to us); the chief's summary (we
    print our own)."""

    def __init__(self, across_hosts, chief, console):
        self.across_hosts, self.chief, self.console = across_hosts, chief, console
        self.summary, self.pinned = None, {}
        self._lock = threading.Lock()

    def write(self, process, line):
        tag = f"{process.host} {process.name}" if self.across_hosts else process.name
        data = self._data(process, line)
        with self._lock:
            if data is None:
                self.console.line(f"[{tag}] {line.rstrip(chr(10))}")
            elif "pinned" in data:
                pinned = data["pinned"]
                self.pinned[(pinned["job"], pinned["task"])] = pinned["device"]
            elif "progress" in data:
                progress = data["progress"]
                self.console.progress(progress["step"], progress["total"], f"[{tag}] {progress['text']}")
            else:
                self.summary = data

    def _data(self, process, line):
        """What a task writes as data (a JSON object on a line: the chief's
        progress and summary, any task's device), else None."""
        if not line.startswith("{"):
            return None
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or (process.name != self.chief and "pinned" not in data):
            return None
        return data

    def worker_devices(self, workers):
        """What each worker task computes on, as each said, or None if one did not say."""
        devices = [self.pinned.get(("worker", i)) for i in range(workers)]
        return devices if None not in devices else None


class Signals:
    """A scheduler's signal (or Ctrl-C) to `launch` is passed on to every task:
    the job stops at a step its workers agree on, and the chief saves there
    (ringtrain/workloads/preemption.py). Each signal is passed on once it comes."""
    DEADLINE_SEC = 28  # for the chief to save and end after the first signal (SLURM waits 30 s)

    def __init__(self):
        self.received, self.passed_on, self.deadline = [], 0, None
        self._previous = {sig: signal.signal(sig, self._note) for sig in PREEMPTION_SIGNALS}

    def _note(self, signum, frame):
        self.received.append(signum)

    def pass_on(self, running, console):
        """Pass on the signals received since the last call; True once any came."""
        for signum in self.received[self.passed_on:]:
            if self.deadline is None:
                self.deadline = time.monotonic() + self.DEADLINE_SEC
                console.line(f"{PROG} launch: {signal.Signals(signum).name}: passed on to every task; the job "
                             f"stops at a step its workers agree on, and the chief saves there")
            for process in running.values():
                process.send_signal(signum)
        self.passed_on = len(self.received)
        return self.deadline is not None

    def restore(self):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def watch(running, chief_name, losses, signals, console):
    """Wait until the chief exits 0 (returns None) or a task fails in a way
    training cannot survive (returns it). After a signal, only the chief's
    end counts (the others end as the job stops), or the deadline."""
    while True:
        stopping = signals.pass_on(running, console)
        for name, process in list(running.items()):
            status = process.poll()
            if status is None or name in losses.lost:
                continue
            if name == chief_name:
                return None if status == 0 else process
            if status == EXIT_PREEMPTED and not stopping:
                # a task sent a signal before its training started left at once: the job stops, as if
                # this launcher had been sent it
                signals.received.append(signal.SIGTERM)
                losses.lost.add(name)
                continue
            if status != 0 and not stopping and not losses.survive(process):
                return process
        if stopping and time.monotonic() > signals.deadline:
            console.line(f"{PROG} launch: the chief did not stop within {signals.DEADLINE_SEC} s of the signal; "
                         "ending every task")
            return running[chief_name]
        time.sleep(0.2)


class WorkerLosses:
    """What a dead non-chief worker means: a restart (--restart-workers), or
    training going on without it where the mode allows (ps_baseline/losses.py),
    in one line either way."""

    def __init__(self, args, tasks, chief, start, console):
        self.args, self.start, self.console = args, start, console
        self.ps = ps_config(args)
        self.workers = {t.name: t for t in tasks if t.job == "worker" and t is not chief}
        self.restarts, self.lost = {}, set()

    def survive(self, process):
        task = self.workers.get(process.name)
        if task is None or not losses.rejoins(self.ps):  # PS tasks, the chief; a worker every step runs on
            return False
        if process.returncode == EXIT_STOPPED:  # it stopped the training on purpose, and said why
            return False
        died = f"{PROG} launch: {process.name}{' on ' + task.host if self.args.hostfile else ''} " \
               f"{process.describe_exit()}"
        if self.args.restart_workers and self.restarts.get(task.name, 0) < MAX_RESTARTS:
            self.restarts[task.name] = self.restarts.get(task.name, 0) + 1
            self.console.line(f"{died}; restarting it ({self.restarts[task.name]} of {MAX_RESTARTS}): it "
                              "rejoins where it left off")
            self.start(task)
            return True
        workers, alive = len(self.workers) + 1, len(self.workers) - len(self.lost)  # (alive without this one)
        if not losses.goes_on_without(self.ps, workers, alive):
            return False
        self.lost.add(task.name)
        how = "async" if not self.ps.sync else f"sync with {losses.workers_needed(self.ps, workers)} of {workers} " \
            "per update"
        self.console.line(f"{died}; training goes on without it ({how}, {alive} worker(s) left)")
        return True
