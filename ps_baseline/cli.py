"""`ps-baseline`: TensorFlow's own parameter-server training, one process per
task as the classic distributed-TensorFlow tutorials start it, or a whole
cluster with `ps-baseline launch`."""
import argparse
import os
import sys

from ps_baseline.cluster import check_port_free, check_task, make_cluster
from ringtrain import modes
from ringtrain.multihost.slurm_step import DEFAULT_PORT_BASE
from ps_baseline.options import EXPOSURE_SAID_ENV, PROG, add_mode_flags, check_mode, ps_config
from ps_baseline.scheduled import place, started_by_a_launcher
from ringtrain.workloads import config as run_config
from ringtrain.common.errors import UsageError, run_cli
from ringtrain.workloads.outputs import check_outputs
from ringtrain.workloads.preemption import PREEMPTION
from ringtrain.common.parsing import add_version, positive_int
from ringtrain.workloads.flags import OneLineParser, add_training_flags, load_training_data

CLUSTER_FLAGS = ("ps_hosts", "worker_hosts", "job_name")  # a task's place: all given, or none under a launcher
SEED_HOSTS = "--ps_hosts=localhost:2222,localhost:2223 --worker_hosts=localhost:2224,localhost:2225"

TASK_EXAMPLE = f"""\
examples (the classic tutorials' four terminals; add --is_sync=True or --sync for sync):
  {PROG} {SEED_HOSTS} --job_name=ps --task_index=0
  {PROG} {SEED_HOSTS} --job_name=ps --task_index=1
  {PROG} {SEED_HOSTS} --job_name=worker --task_index=0
  {PROG} {SEED_HOSTS} --job_name=worker --task_index=1

Across hosts, each task runs on the host its address names (e.g. --ps_hosts=h2:2222).
Or let mpirun or SLURM start every task, each taking its task from its rank:
  mpirun -np 4 --hostfile hosts {PROG} --num-ps 1 --sync    # 1 PS task, 3 workers
  srun -n 4 {PROG} --num-ps 1 --sync                        # the same, in a SLURM job
The whole cluster in one command: {PROG} launch --help
One process, one tower per device: {PROG} towers --help
"""


USAGE = f"""{PROG} [FLAGS]                      one task of a PS cluster (the flags below)
       {PROG} launch [FLAGS]               a whole PS cluster, one process per task ({PROG} launch --help)
       {PROG} towers --towers K [FLAGS]    one process, one tower per device ({PROG} towers --help)"""


def task_parser():
    parser = OneLineParser(
        prog=PROG, usage=USAGE, description="One task of TensorFlow's parameter-server training, as the classic "
        "distributed-TensorFlow tutorials run their MNIST: PS tasks serve variables, workers train with "
        "between-graph replication.",
        epilog=TASK_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    g = parser.add_argument_group("cluster (the classic tutorials' flags)")
    g.add_argument("--ps_hosts", metavar="H:P,...", help="comma-separated PS host:port list")
    g.add_argument("--worker_hosts", metavar="H:P,...",
                   help="comma-separated worker host:port list; worker 0 is the chief")
    g.add_argument("--job_name", metavar="JOB", help="ps or worker (chief: --api tf2's coordinator)")
    g.add_argument("--task_index", type=int, default=0, metavar="I", help="index within the job (default 0)")
    g.add_argument("--chief_host", metavar="H:P", help="--api tf2 only: the coordinator's host:port")
    m = parser.add_argument_group("started by mpirun or srun (no cluster flags: the rank picks the task)")
    m.add_argument("--num-ps", type=positive_int, default=1, metavar="P",
                   help="ranks 0..P-1 are PS tasks, the rest workers (with --api tf2, rank 0 is the "
                        "coordinator and the PS tasks follow it), as TF's SlurmClusterResolver orders them "
                        "(default %(default)s)")
    m.add_argument("--port-base", type=positive_int, default=DEFAULT_PORT_BASE, metavar="PORT",
                   help="under srun without MPI: each task serves on PORT plus its place on its node "
                        "(default %(default)s; under MPI, free ports are chosen and shared)")
    add_mode_flags(parser)
    add_training_flags(parser)
    return parser


def run_task(argv):
    args = task_parser().parse_args(argv)
    PREEMPTION.install(PROG)  # a scheduler's signal: ends at once, or, once training runs, saves first
    cluster = place_task(args)
    mode = modes.chosen("ps-baseline", args)
    job, index = mode.trainer_task
    trains = args.job_name == job and index in (None, args.task_index)
    dataset = load_training_data(args) if trains else None  # numpy: bad paths fail before TF loads

    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    tf = import_tensorflow_quietly()
    if trains:
        return mode.load("train")(run_config.from_args(args), ps_config(args), cluster, args.task_index, dataset)
    return mode.load("serve")(tf, cluster, args.job_name, args.task_index, args.threads,
                              lambda msg: print(msg, flush=True))


def place_task(args):
    """This task's cluster, from its flags or its launcher's rank, checked; the
    warning of where its server listens."""
    given = [flag for flag in CLUSTER_FLAGS if getattr(args, flag)]
    if not given and started_by_a_launcher():
        place(args)  # mpirun's or srun's rank decides the task
    elif len(given) < len(CLUSTER_FLAGS):
        missing = ", ".join(f"--{flag}" for flag in CLUSTER_FLAGS if flag not in given)
        raise UsageError(f"{missing} missing: a task needs --ps_hosts, --worker_hosts and --job_name (or start "
                         f"every task with mpirun -np P+W or srun, which pick them; or use {PROG} launch)")
    cluster = make_cluster(args.ps_hosts, args.worker_hosts, args.chief_host)
    check_mode(args, len(cluster.worker))
    check_outputs(args)
    if args.api == "tf2" and not cluster.chief:
        raise UsageError("--api tf2 needs --chief_host=H:P: the coordinator task that drives training")
    if args.api == "v1" and cluster.chief:
        raise UsageError("--chief_host is for --api tf2 only: with v1, worker 0 is the chief")
    check_task(cluster, args.job_name, args.task_index)
    address = cluster.address(args.job_name, args.task_index)
    check_port_free(address, f"{args.job_name} task {args.task_index}")
    if not os.environ.get(EXPOSURE_SAID_ENV):  # (`launch` says it once for the whole cluster)
        print(f"{PROG}: {args.job_name} task {args.task_index}: warning: TF's gRPC server at {address} listens on "
              f"every interface and runs any graph sent to it, without authentication: keep port "
              f"{address.rsplit(':', 1)[1]} closed to all but the cluster's hosts", flush=True)
    return cluster


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "launch":
        from ps_baseline import launcher
        return run_cli(f"{PROG} launch", launcher.main, argv[1:])
    if argv and argv[0] == "towers":
        from ps_baseline import towers
        return run_cli(f"{PROG} towers", towers.main, argv[1:], exit_at_once=True)
    return run_cli(PROG, run_task, argv, exit_at_once=True)


if __name__ == "__main__":
    sys.exit(main())
