"""`ps-baseline`: TensorFlow's own parameter-server training, one process per
task as in the seeds, or a whole localhost cluster with `ps-baseline launch`."""
import argparse
import sys

from ps_baseline.cluster import check_port_free, check_task, make_cluster
from workloads.errors import UsageError, run_cli
from workloads.flags import (OneLineParser, add_training_flags, load_training_data,
                             positive_float, positive_int)

PROG = "ps-baseline"
PLACEMENTS = ("round_robin", "greedy", "partitioned")  # see ps_baseline/placement.py
SEED_HOSTS = "--ps_hosts=localhost:2222,localhost:2223 --worker_hosts=localhost:2224,localhost:2225"

TASK_EXAMPLE = f"""\
examples (the seeds' four terminals; add --is_sync=True or --sync for sync):
  {PROG} {SEED_HOSTS} --job_name=ps --task_index=0
  {PROG} {SEED_HOSTS} --job_name=ps --task_index=1
  {PROG} {SEED_HOSTS} --job_name=worker --task_index=0
  {PROG} {SEED_HOSTS} --job_name=worker --task_index=1

The whole cluster on this machine in one command: {PROG} launch --help
"""


def parse_bool(text):
    value = text.strip().lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("false", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


def add_mode_flags(parser):
    """PS-mode flags shared by the per-task command and `launch`."""
    g = parser.add_argument_group("parameter-server mode")
    g.add_argument("--sync", action="store_true",
                   help="synchronous training with SyncReplicasOptimizer (default: async, as the seeds)")
    g.add_argument("--is_sync", type=parse_bool, nargs="?", const=True, dest="sync", metavar="BOOL",
                   help="the seeds' spelling of --sync: --is_sync=True")
    g.add_argument("--replicas-to-aggregate", type=positive_int, metavar="K",
                   help="sync: gradients per update (default: all workers); K below the worker "
                        "count leaves backup workers, so one slow or dead worker does not stall training")
    g.add_argument("--api", choices=("v1", "tf2"), default="v1",
                   help="v1: the seeds' between-graph replication (default); tf2: "
                        "tf.distribute.ParameterServerStrategy + ClusterCoordinator (async only)")
    g.add_argument("--placement", choices=PLACEMENTS, default="round_robin",
                   help="variables over PS tasks: round_robin (replica_device_setter's default), "
                        "greedy (balance bytes), partitioned (split big variables over all PS)")
    g.add_argument("--partition-min-bytes", type=positive_int, default=64 * 1024, metavar="N",
                   help="partitioned: split variables of at least N bytes (default %(default)s)")
    g.add_argument("--show-placement", action="store_true",
                   help="print each variable's PS and the bytes per PS before training")
    g.add_argument("--checkpoint-every", type=positive_int, metavar="K",
                   help="chief: checkpoint every K global steps (default: every 600 s and at the end)")
    g.add_argument("--startup-timeout", type=positive_float, default=60.0, metavar="SEC",
                   help="give up if a PS (or the chief's initialisation) is not there after SEC "
                        "seconds (default %(default)g)")
    g.add_argument("--report-timeout", type=positive_float, default=120.0, metavar="SEC",
                   help="chief: after its own training, wait at most SEC seconds for the other "
                        "workers' reports (default %(default)g)")
    return parser


def task_parser():
    parser = OneLineParser(
        prog=PROG, description="One task of TensorFlow's parameter-server training (the seeds' "
        "distributed MNIST): PS tasks serve variables, workers train with between-graph replication.",
        epilog=TASK_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = parser.add_argument_group("cluster (the seeds' flags)")
    g.add_argument("--ps_hosts", required=True, metavar="H:P,...", help="comma-separated PS host:port list")
    g.add_argument("--worker_hosts", required=True, metavar="H:P,...",
                   help="comma-separated worker host:port list; worker 0 is the chief")
    g.add_argument("--job_name", required=True, metavar="JOB", help="ps or worker (chief: --api tf2's coordinator)")
    g.add_argument("--task_index", type=int, default=0, metavar="I", help="index within the job (default 0)")
    g.add_argument("--chief_host", metavar="H:P", help="--api tf2 only: the coordinator's host:port")
    add_mode_flags(parser)
    add_training_flags(parser)
    return parser


def check_mode(args, num_workers):
    if args.replicas_to_aggregate and not args.sync:
        raise UsageError("--replicas-to-aggregate needs --sync: async training applies every gradient")
    if args.replicas_to_aggregate and args.replicas_to_aggregate > num_workers:
        raise UsageError(f"--replicas-to-aggregate {args.replicas_to_aggregate} exceeds the "
                         f"{num_workers} worker(s): use 1..{num_workers}")
    if args.api == "tf2" and args.sync:
        raise UsageError("--api tf2 (ParameterServerStrategy + ClusterCoordinator) is async only: drop --sync")
    if args.api == "tf2" and args.placement == "greedy":
        raise UsageError("--api tf2 places variables round-robin or partitioned; greedy is v1 only")


def run_task(argv):
    args = task_parser().parse_args(argv)
    cluster = make_cluster(args.ps_hosts, args.worker_hosts, args.chief_host)
    if args.api == "tf2" and not cluster.chief:
        raise UsageError("--api tf2 needs --chief_host=H:P: the coordinator task that drives training")
    if args.api == "v1" and cluster.chief:
        raise UsageError("--chief_host is for --api tf2 only: with v1, worker 0 is the chief")
    check_task(cluster, args.job_name, args.task_index)
    check_mode(args, len(cluster.worker))
    check_port_free(cluster.address(args.job_name, args.task_index),
                    f"{args.job_name} task {args.task_index}")
    trains = args.job_name == ("chief" if args.api == "tf2" else "worker")
    dataset = load_training_data(args) if trains else None  # numpy: bad paths fail before TF loads

    from workloads.tfenv import import_tensorflow_quietly, set_threads
    tf = import_tensorflow_quietly()
    from ps_baseline import servers
    log = lambda msg: print(msg, flush=True)
    if args.api == "tf2":
        from ps_baseline import worker_tf2
        if trains:
            return worker_tf2.train(args, cluster, dataset)
        return worker_tf2.serve(tf, cluster, args.job_name, args.task_index, args.threads, log)
    set_threads(args.threads)
    if args.job_name == "ps":
        server = servers.start_server(tf, cluster, "ps", args.task_index, args.threads)
        return servers.run_ps(tf, server, args.task_index, args.threads, log)
    from ps_baseline import worker_v1
    return worker_v1.train(args, cluster, dataset)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "launch":
        from ps_baseline import launcher
        return run_cli(f"{PROG} launch", launcher.main, argv[1:])
    return run_cli(PROG, run_task, argv)


if __name__ == "__main__":
    sys.exit(main())
