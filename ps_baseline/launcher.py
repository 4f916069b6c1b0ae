"""`ps-baseline launch`: a whole PS cluster on localhost, one process per
task, as if each had been started in its own terminal.

Tasks get free ports, run in their own process groups (built as argument
lists, never shell strings), and print through here with a [task] prefix.
If any task fails, or on Ctrl-C, every task is stopped. The exit status is
the chief's, and the last stdout line is the chief's JSON summary.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from ps_baseline.cli import PROG, add_mode_flags, check_mode, task_parser
from ps_baseline.cluster import free_ports
from workloads.errors import UsageError
from workloads.flags import OneLineParser, add_training_flags, load_training_data, positive_int
from workloads.summary import emit

WORKERS_GRACE_SEC = 60  # after the chief is done, time for the others to finish
STOP_GRACE_SEC = 5      # SIGTERM, then SIGKILL after this long

EXAMPLE = f"""\
examples:
  {PROG} launch --num-ps 2 --num-workers 2 --sync --model mnist_cnn --epochs 5
  {PROG} launch --num-ps 2 --num-workers 2 --model mnist_cnn --epochs 5          # async
  {PROG} launch --num-ps 2 --num-workers 3 --sync --replicas-to-aggregate 2     # 1 backup worker
  {PROG} launch --num-ps 2 --num-workers 2 --placement partitioned --show-placement --steps 50
  {PROG} launch --num-ps 1 --num-workers 2 --api tf2 --epochs 1                 # ParameterServerStrategy
"""


def launch_parser():
    parser = OneLineParser(prog=f"{PROG} launch", epilog=EXAMPLE,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Start a whole PS cluster on this machine (free ports, one "
                           "process per task) and print the chief's JSON summary last.")
    parser.add_argument("--num-ps", type=positive_int, default=1, metavar="P", help="PS tasks (default 1)")
    parser.add_argument("--num-workers", type=positive_int, default=2, metavar="W",
                        help="worker tasks (default 2); worker 0 is the chief")
    add_mode_flags(parser)
    add_training_flags(parser)
    return parser


def task_flags(args):
    """The mode and training flags to hand every task, as --flag=value words."""
    words, seen = [], set()
    for action in task_parser()._actions:
        dest = action.dest
        if not action.option_strings or dest in seen or dest in ("help", "summary_json"):
            continue
        if dest in ("ps_hosts", "worker_hosts", "job_name", "task_index", "chief_host"):
            continue
        seen.add(dest)
        value = getattr(args, dest, None)
        if value is None or value == action.default:
            continue
        flag = max(action.option_strings, key=len)
        words.append(flag if value is True else f"{flag}={value}")
    return words


class Task:
    def __init__(self, name, argv, output_lock):
        self.name, self.argv = name, argv
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # Own process group: Ctrl-C reaches only the launcher, which then stops
        # every task by group; the parent-death signal covers a killed launcher.
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                     text=True, bufsize=1, preexec_fn=_die_with_parent)
        self.reader = threading.Thread(target=self._prefix_lines, args=(output_lock,), daemon=True)
        self.reader.start()

    def _prefix_lines(self, lock):
        for line in self.proc.stdout:
            with lock:
                sys.stdout.write(f"[{self.name}] {line}")
                sys.stdout.flush()

    @property
    def status(self):
        return self.proc.poll()

    def signal_group(self, sig):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


def _die_with_parent():
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def stop_all(tasks):
    for task in tasks:
        task.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SEC
    for task in tasks:
        try:
            task.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            task.signal_group(signal.SIGKILL)
            task.proc.wait()


def describe_status(status):
    return f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"


def main(argv):
    args = launch_parser().parse_args(argv)
    check_mode(args, args.num_workers)
    load_training_data(args)  # bad data flags fail here, before any task starts
    tf2 = args.api == "tf2"
    ports = free_ports(args.num_ps + args.num_workers + (1 if tf2 else 0))
    hosts = [f"localhost:{p}" for p in ports]
    ps_hosts, worker_hosts = hosts[:args.num_ps], hosts[args.num_ps:args.num_ps + args.num_workers]
    cluster_words = [f"--ps_hosts={','.join(ps_hosts)}", f"--worker_hosts={','.join(worker_hosts)}"]
    if tf2:
        cluster_words.append(f"--chief_host={hosts[-1]}")
    chief_name = "chief" if tf2 else "worker0"

    workdir = tempfile.mkdtemp(prefix="ps-baseline-launch-")
    summary_path = os.path.join(workdir, "summary.json")
    specs = [(f"ps{i}", "ps", i) for i in range(args.num_ps)]
    specs += [(f"worker{i}", "worker", i) for i in range(args.num_workers)]
    if tf2:
        specs.append(("chief", "chief", 0))
    flags = task_flags(args)
    base = [sys.executable, "-m", "ps_baseline.cli", *cluster_words]

    print(f"{PROG} launch: {args.num_ps} ps at {','.join(ps_hosts)}; {args.num_workers} workers at "
          f"{','.join(worker_hosts)}{'; coordinator at ' + hosts[-1] if tf2 else ''}", flush=True)
    lock, tasks = threading.Lock(), []
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        for name, job, index in specs:
            extra = [f"--summary-json={summary_path}"] if name == chief_name else []
            tasks.append(Task(name, [*base, f"--job_name={job}", f"--task_index={index}", *flags, *extra], lock))
        chief = next(t for t in tasks if t.name == chief_name)
        failed = watch(tasks, chief)
        if failed is None and not tf2:  # (TF2's servers join forever: nothing to wait for)
            # The chief is done: the others finish their reports, the PS tasks shut down.
            wait_for_exit([t for t in tasks if t is not chief], WORKERS_GRACE_SEC)
    finally:
        stop_all(tasks)
        for task in tasks:
            task.reader.join(timeout=5)
        signal.signal(signal.SIGTERM, previous_sigterm)

    if failed is not None:
        sys.stderr.write(f"{PROG} launch: {failed.name} {describe_status(failed.status)}; "
                         "stopped every task\n")
        return chief.status if chief.status not in (None, 0) and chief.status > 0 else 1
    if chief.status != 0:
        return chief.status
    try:
        with open(summary_path) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"the chief finished but wrote no summary ({e})") from None
    summary["launch"] = {"num_ps": args.num_ps, "num_workers": args.num_workers,
                         "ps_hosts": ps_hosts, "worker_hosts": worker_hosts}
    emit(summary, args.summary_json)
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def watch(tasks, chief):
    """Wait until the chief exits 0 (returns None) or any task fails (returns it)."""
    while True:
        for task in tasks:
            status = task.status
            if status is None:
                continue
            if task is chief:
                return None if status == 0 else chief
            if status != 0:
                return task
        time.sleep(0.2)


def wait_for_exit(tasks, timeout):
    deadline = time.monotonic() + timeout
    while any(t.status is None for t in tasks) and time.monotonic() < deadline:
        time.sleep(0.2)
