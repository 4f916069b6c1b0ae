"""Every mode ringtrain trains in, registered once. Both commands choose
their mode here, the bench runs the modes it names here, and the tests walk
the README's mode table by it. Adding a mode is writing its module (a
workloads.mode.Mode, and the function that trains with it) and registering
it here; nothing else. (No import of a mode's module happens here: a mode is
named by its module's path, and loaded when it runs.)

How a command calls a mode's `train`, after the flags and the data are checked:
- `ringtrain`: train(config, args, dataset) -> exit status; it imports
  TensorFlow itself, when it may;
- `ps-baseline` (a task): train(config, ps, cluster, task, dataset) for the
  task that trains, serve(tf, cluster, job, task, threads, log) for the others;
- `ps-baseline towers`: its own command, main(argv).
"""
import importlib
from dataclasses import dataclass

# How a mode is started with N workers (and P PS tasks) on one machine: the
# argument list the bench and the tests run, from the words that select it.
LAUNCHERS = ("mpirun", "horovodrun-elastic", "ps-baseline launch", "ps-baseline towers")


@dataclass(frozen=True)
class RegisteredMode:
    name: str            # the summary's "mode", and the bench's name for it
    row: str             # its row in the README's table
    command: str         # how a user starts it with N workers: the table's command column
    cli: str             # "ringtrain", "ps-baseline" or "ps-baseline towers": which command runs it
    selected_by: dict    # the parsed flags that choose it on that command: {"backend": "tf-collective"}
    train: str           # "module:function" that trains (see above)
    launcher: str        # one of LAUNCHERS
    words: tuple = ()    # the words that select it on the launcher's command line
    serve: str = None    # "module:function" for a task that serves (PS mode)
    trainer_task: tuple = ()  # (job, index or None: any) of the PS tasks that train; the others serve
    pinning: str = ""    # the table's GPU pinning: "local rank", "per host", "one per tower"
    progress: str = "bar"  # the table's progress column: "bar", or "lines" where the launcher splits output
    exchange: str = "none"  # what carries the gradients: "horovod", "tf", "ps" (the bench's α-β model)
    one_process: bool = False  # one process drives (and times) every worker
    across_hosts: bool = True  # it can run its workers on several hosts
    sync: bool = True    # every update waits for every worker's gradients (else each worker's is an update)
    table_only: bool = False   # a row of the table, not a mode the bench compares (elastic ring)

    def load(self, which="train"):
        """The function named by `train` (or `serve`)."""
        module, _, function = getattr(self, which).partition(":")
        return getattr(importlib.import_module(module), function)

    def chosen_by(self, args):
        return all(getattr(args, flag, None) == value for flag, value in self.selected_by.items())


MODES = (
    RegisteredMode("ring", "ring", "mpirun -np N ringtrain", "ringtrain", {"backend": "horovod", "elastic": False},
                   "ringtrain.train:main", "mpirun", pinning="local rank", exchange="horovod"),
    RegisteredMode("ring", "elastic ring", "horovodrun --gloo -np N --host-discovery-script S ringtrain --elastic",
                   "ringtrain", {"backend": "horovod", "elastic": True}, "ringtrain.elastic:main",
                   "horovodrun-elastic", ("--elastic",), pinning="local rank", progress="lines", exchange="horovod",
                   table_only=True),
    RegisteredMode("tf-collective", "TF collective", "mpirun -np N ringtrain --backend tf-collective", "ringtrain",
                   {"backend": "tf-collective"}, "ringtrain.collective:main", "mpirun",
                   ("--backend", "tf-collective"), pinning="local rank", exchange="tf"),
    RegisteredMode("ps-sync", "PS sync", "ps-baseline launch --sync", "ps-baseline",
                   {"api": "v1", "replication": "between-graph", "sync": True}, "ps_baseline.worker_v1:train",
                   "ps-baseline launch", ("--sync",), serve="ps_baseline.servers:serve_task",
                   trainer_task=("worker", None), pinning="per host", exchange="ps"),
    RegisteredMode("ps-async", "PS async", "ps-baseline launch", "ps-baseline",
                   {"api": "v1", "replication": "between-graph", "sync": False}, "ps_baseline.worker_v1:train",
                   "ps-baseline launch", serve="ps_baseline.servers:serve_task", trainer_task=("worker", None),
                   pinning="per host", exchange="ps", sync=False),
    RegisteredMode("ps-ingraph", "in-graph", "ps-baseline launch --replication in-graph", "ps-baseline",
                   {"api": "v1", "replication": "in-graph"}, "ps_baseline.worker_ingraph:train",
                   "ps-baseline launch", ("--replication", "in-graph"), serve="ps_baseline.worker_ingraph:serve",
                   trainer_task=("worker", 0), pinning="per host", exchange="ps", one_process=True),
    RegisteredMode("ps-tf2", "TF2 PS", "ps-baseline launch --api tf2", "ps-baseline", {"api": "tf2"},
                   "ps_baseline.worker_tf2:train", "ps-baseline launch", ("--api", "tf2"),
                   serve="ps_baseline.worker_tf2:serve", trainer_task=("chief", None), pinning="per host", exchange="ps", one_process=True,
                   sync=False),
    RegisteredMode("towers", "towers", "ps-baseline towers --towers N", "ps-baseline towers", {},
                   "ps_baseline.towers:main", "ps-baseline towers", pinning="one per tower", one_process=True,
                   across_hosts=False),
)


def by_row(row):
    return next(m for m in MODES if m.row == row)


def by_name(name):
    """The mode the bench and the summaries call `name` (not a table-only row)."""
    return next(m for m in MODES if m.name == name and not m.table_only)


def benched():
    """The modes the bench compares, by name, in the registry's order."""
    return [m for m in MODES if not m.table_only]


def chosen(cli, args):
    """The mode `cli`'s parsed flags choose (its first match), or None."""
    return next((m for m in MODES if m.cli == cli and m.chosen_by(args)), None)


def backends():
    """`ringtrain --backend`'s choices, in the registry's order."""
    return list(dict.fromkeys(m.selected_by["backend"] for m in MODES if m.cli == "ringtrain"))
