"""The PS-mode flags that a task (`ps-baseline --job_name ...`) and
`ps-baseline launch` share, and their checks: one place for both."""
import argparse
from dataclasses import dataclass

from ringtrain.workloads.catalog import simulated_step_ms
from ringtrain.common.errors import UsageError
from ringtrain.common.parsing import positive_float, positive_int
from ringtrain.workloads.flags import refuse_sync_batch_norm
from ringtrain.workloads.straggler import check as check_straggler
from ringtrain.workloads.user_models import is_user_model

PROG = "ps-baseline"
PLACEMENTS = ("round_robin", "greedy", "partitioned")  # see ps_baseline/placement.py
# Set by `launch` for its tasks: it has said where their servers can be reached.
EXPOSURE_SAID_ENV = "PS_BASELINE_EXPOSURE_SAID"
# How a PS job goes on after it ended: its checkpoints are the chief's.
RESUME = "restart the cluster with --resume (the same --checkpoint-dir) to go on from the last checkpoint"


def parse_bool(text):
    value = text.strip().lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("false", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


def add_mode_flags(parser):
    g = parser.add_argument_group("parameter-server mode")
    g.add_argument("--sync", action="store_true",
                   help="synchronous training with SyncReplicasOptimizer (default: async, as in the classic "
                        "distributed-TensorFlow tutorials)")
    g.add_argument("--is_sync", type=parse_bool, nargs="?", const=True, dest="sync", metavar="BOOL",
                   help="the classic tutorials' spelling of --sync: --is_sync=True")
    g.add_argument("--replicas-to-aggregate", type=positive_int, metavar="K",
                   help="sync: gradients per update (default: all workers); K below the worker "
                        "count leaves backup workers, so one slow or dead worker does not stall training")
    g.add_argument("--replication", choices=("between-graph", "in-graph"), default="between-graph",
                   help="between-graph: every worker builds its own replica of the graph (default); "
                        "in-graph: worker 0 alone builds one graph with a tower on every worker task "
                        "and feeds them all (synchronous; the other workers only serve)")
    g.add_argument("--api", choices=("v1", "tf2"), default="v1",
                   help="v1: TF1's between-graph replication, in tf.compat.v1 graph mode (default); tf2: "
                        "tf.distribute.ParameterServerStrategy + ClusterCoordinator (async only)")
    g.add_argument("--placement", choices=PLACEMENTS, default="round_robin",
                   help="variables over PS tasks: round_robin (replica_device_setter's default), "
                        "greedy (balance bytes), partitioned (split big variables over all PS)")
    g.add_argument("--partition-min-bytes", type=positive_int, default=64 * 1024, metavar="N",
                   help="partitioned: split variables of at least N bytes (default %(default)s)")
    g.add_argument("--show-placement", action="store_true",
                   help="print each variable's PS and the bytes per PS before training")
    g.add_argument("--startup-timeout", type=positive_float, default=60.0, metavar="SEC",
                   help="give up if a PS (or the chief's initialisation) is not there after SEC "
                        "seconds (default %(default)g)")
    g.add_argument("--report-timeout", type=positive_float, default=120.0, metavar="SEC",
                   help="chief: after its own training, wait at most SEC seconds for the other "
                        "workers' reports (default %(default)g)")
    return parser


def check_mode(args, num_workers):
    if args.replication == "in-graph":
        if args.api == "tf2":
            raise UsageError("--replication in-graph is TF1's, in tf.compat.v1 graph mode: drop --api tf2")
        if args.replicas_to_aggregate:
            raise UsageError("--replication in-graph averages every tower each step: "
                             "--replicas-to-aggregate is for between-graph --sync")
    if args.replicas_to_aggregate and not args.sync:
        raise UsageError("--replicas-to-aggregate needs --sync: async training applies every gradient")
    if args.replicas_to_aggregate and args.replicas_to_aggregate > num_workers:
        raise UsageError(f"--replicas-to-aggregate {args.replicas_to_aggregate} exceeds the "
                         f"{num_workers} worker(s): use 1..{num_workers}")
    if args.api == "tf2" and args.sync:
        raise UsageError("--api tf2 (ParameterServerStrategy + ClusterCoordinator) is async only: drop --sync")
    if args.api == "tf2" and args.placement == "greedy":
        raise UsageError("--api tf2 places variables round-robin or partitioned; greedy is v1 only")
    check_straggler(args.straggler, num_workers, "worker task")
    refuse_sync_batch_norm(args, "PS workers each push their own batch's gradients")
    if args.api == "v1" and is_user_model(args.model) and not simulated_step_ms(args.model, args.simulate_gpu):
        raise UsageError(f"--model {args.model}: Keras cannot build its layers in the tf.compat.v1 graphs of "
                         f"--api v1 ({args.replication}): use --api tf2 (ParameterServerStrategy), or add "
                         f"--simulate-gpu MS to exchange its gradients' real shapes")
    if args.api == "tf2" and args.placement == "partitioned" and is_user_model(args.model) and \
            not simulated_step_ms(args.model, args.simulate_gpu):
        raise UsageError(f"--model {args.model}: Keras 3 layers cannot use the sharded variables of --placement "
                         f"partitioned: use --placement round_robin")
    if args.snapshot_every and args.placement == "partitioned":
        raise UsageError("--snapshot-every saves whole variables: use --placement round_robin or greedy")


@dataclass(frozen=True)
class PSConfig:
    """PS mode's own flags, for a task."""
    sync: bool = False
    replicas_to_aggregate: int = None  # sync: gradients per update (None: every worker)
    replication: str = "between-graph"
    api: str = "v1"
    placement: str = "round_robin"
    partition_min_bytes: int = 64 * 1024
    show_placement: bool = False
    startup_timeout: float = 60.0
    report_timeout: float = 120.0


def ps_config(args):
    return PSConfig(bool(args.sync), args.replicas_to_aggregate, args.replication, args.api, args.placement,
                    args.partition_min_bytes, args.show_placement, args.startup_timeout, args.report_timeout)
