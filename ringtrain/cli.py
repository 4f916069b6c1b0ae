"""`ringtrain`: the ring-allreduce trainer, and `ringtrain doctor`."""
import os
import sys

from ringtrain.multihost.slurm_step import DEFAULT_PORT_BASE
from ringtrain import modes
from ringtrain.common import parsing
from ringtrain.workloads import config, flags
from ringtrain.common.errors import UsageError, launched_size, run_cli
from ringtrain.workloads.gradients import DEFAULT_BUCKET_MB, DEFAULT_RING_BUCKET_MB, LAST_BUCKET_MB
from ringtrain.workloads.horovod_env import CPU_OPERATIONS, HOROVOD_LOOPS, MPI_ALLREDUCE_ALGORITHMS

COMMUNICATIONS = ("RING", "AUTO", "NCCL")  # tf.distribute.experimental.CommunicationImplementation
from ringtrain.workloads.outputs import check_outputs
from ringtrain.workloads.preemption import PREEMPTION
from ringtrain.workloads.straggler import check as check_straggler

EXAMPLES = """examples:
  horovodrun -np 2 ringtrain --model mnist_cnn --epochs 5
  horovodrun --gloo -np 2 ringtrain --model mnist_cnn --epochs 5
  mpirun -np 2 ringtrain --model mnist_mlp --epochs 2
  mpirun --hostfile mpi_hostfiles/localhost ringtrain --model mnist_cnn
  ringtrain --model cifar_resnet --data-dir ~/data/cifar10 --data cifar10 --epochs 30 --checkpoint-dir ckpt
  mpirun -np 2 ringtrain --model keras:ResNet50 --image-shape 224x224x3 --data '/data/imagenet/train-*'
  mpirun -np 2 ringtrain --model my_model:small_cnn --data ~/photos/train --precision mixed_bfloat16
  horovodrun -np 4 ringtrain --checkpoint-dir ckpt --resume     # continue on any N
  mpirun -np 2 ringtrain --backend tf-collective                 # TF's own collective all-reduce
  ringtrain doctor                                               # check the install
"""


USAGE = "ringtrain [FLAGS]\n       ringtrain doctor [--hostfile FILE --np N]"


def parser():
    p = flags.OneLineParser(
        prog="ringtrain", epilog=EXAMPLES, usage=USAGE,
        formatter_class=flags.argparse.RawDescriptionHelpFormatter,
        description="Synchronous data-parallel training over Horovod's ring-allreduce "
                    "(scatter-reduce then allgather), or over TensorFlow's own collective all-reduce "
                    "(--backend tf-collective). Launch with horovodrun or mpirun; alone it runs one rank.\n\n"
                    "commands:\n"
                    "  ringtrain [FLAGS]   train (the flags below)\n"
                    "  ringtrain doctor    check the install, and a cluster's hosts (ringtrain doctor --help)")
    parsing.add_version(p)
    flags.add_training_flags(p)
    b = p.add_argument_group("synchronous data parallelism (every backend)")
    b.add_argument("--backend", choices=modes.backends(), default="horovod",
                   help="horovod: Horovod's ring-allreduce (the default); tf-collective: TensorFlow's own "
                        "MultiWorkerMirroredStrategy, under mpirun or with TF_CONFIG set")
    b.add_argument("--no-lr-scaling", action="store_true",
                   help="keep --lr as is instead of multiplying it by the worker count")
    b.add_argument("--warmup-epochs", type=parsing.non_negative_float, default=1.0, metavar="E",
                   help="ramp the lr from --lr to lr*N over E epochs (default 1; 0 disables)")
    b.add_argument("--bucket-mb", type=parsing.non_negative_float, metavar="MB",
                   help="all-reduce the gradients in buckets of about MB, last layers first, each as soon as "
                        "backprop has made its gradients. Horovod: small gradients grouped (hvd.grouped_allreduce), "
                        f"one of MB or more alone (default {DEFAULT_RING_BUCKET_MB:g}; 0: each alone, Horovod fusing "
                        f"what is ready in one cycle). TF's collective mode (default {DEFAULT_BUCKET_MB:g}): grouped as "
                        f"CommunicationOptions.bytes_per_pack groups them, and where they fill more than one, the "
                        f"first layers' (at most {LAST_BUCKET_MB:g} MB) last and alone; 0: one packed all-reduce once "
                        "backprop is done, TF's own default")
    add_collective_flags(p)
    add_horovod_flags(p)
    return p


def add_collective_flags(p):
    t = p.add_argument_group("TF's collective mode (--backend tf-collective)")
    t.add_argument("--communication", type=str.upper, choices=COMMUNICATIONS, metavar="IMPL",
                   help="RING (TF's ring: scatter-reduce then allgather; the default), AUTO (TF picks: NCCL on "
                        "GPUs) or NCCL")
    t.add_argument("--port-base", type=parsing.positive_int, metavar="PORT",
                   help=f"under srun without MPI: each worker serves on PORT plus its place on its node (default "
                        f"{DEFAULT_PORT_BASE}); under mpirun free ports are chosen and shared; TF_CONFIG names its own")


def add_horovod_flags(p):
    r = p.add_argument_group("Horovod (--backend horovod, the default)")
    r.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16")
    r.add_argument("--adasum", action="store_true", help="combine gradients with Adasum")
    r.add_argument("--fusion-threshold-mb", type=parsing.non_negative_float, metavar="MB",
                   help="Horovod tensor-fusion buffer (HOROVOD_FUSION_THRESHOLD; default 128)")
    r.add_argument("--cycle-time-ms", type=parsing.positive_float, metavar="MS",
                   help="Horovod background cycle (HOROVOD_CYCLE_TIME; default 1 ms)")
    r.add_argument("--horovod-loop", choices=sorted(HOROVOD_LOOPS), default=None,
                   help="Horovod's background thread: event (ringtrain's patch, the default) sleeps "
                        "until a tensor is queued; upstream runs a coordination round every cycle "
                        "(HOROVOD_EVENT_DRIVEN_LOOP)")
    r.add_argument("--timeline", "--horovod-timeline", metavar="FILE",
                   help="write a Horovod timeline (chrome://tracing); under horovodrun, which "
                        "claims --timeline itself, spell it --horovod-timeline")
    r.add_argument("--mpi-allreduce", choices=sorted(MPI_ALLREDUCE_ALGORITHMS) + ["default"], metavar="ALG",
                   help="OpenMPI's allreduce algorithm for the gradients: ring (default: scatter-reduce then "
                        "allgather, as the classic distributed-TensorFlow tutorials describe it), rabenseifner, "
                        "recursive_doubling, segmented_ring, ..., or default (OpenMPI picks by size and ranks); "
                        "not used under Gloo")
    r.add_argument("--mpi-busy-wait", action="store_true",
                   help="let OpenMPI spin while waiting (its default); ringtrain otherwise sets "
                        "OMPI_MCA_mpi_yield_when_idle=1, which is faster when ranks share cores")
    r.add_argument("--cpu-operations", choices=CPU_OPERATIONS, default=None,
                   help="under mpirun, what carries the gradients and coordinates Horovod's rounds "
                        "(HOROVOD_CPU_OPERATIONS, HOROVOD_CONTROLLER): auto (the default) takes Gloo when the "
                        "ranks span hosts, where OpenMPI's polling waits cost the compute its cores, and "
                        "OpenMPI (its shared memory) on one host; mpi; gloo")
    r.add_argument("--elastic", action="store_true",
                   help="go on when ranks are lost or added, under horovodrun's elastic mode (horovodrun "
                        "--gloo -np N --min-np M --max-np X --host-discovery-script S ringtrain --elastic)")
    r.add_argument("--commit-every", type=parsing.positive_int, metavar="K",
                   help="--elastic: commit the state every K steps; a lost rank costs at most K steps "
                        "(default 10)")
    r.add_argument("--no-allreduce", action="store_true",
                   help="measurement only: skip the gradient allreduce, so ranks diverge "
                        "(Horovod's background thread still coordinates every cycle)")


# Horovod's own flags: what TF's collective mode has no counterpart for, with why.
HOROVOD_ONLY = {"fp16_allreduce": "Horovod's gradient compression", "adasum": "Horovod's Adasum",
                "fusion_threshold_mb": "Horovod's fusion buffer (--bucket-mb sizes TF's buckets)",
                "cycle_time_ms": "Horovod's background cycle", "horovod_loop": "Horovod's background thread",
                "timeline": "Horovod's timeline", "mpi_allreduce": "OpenMPI's algorithm (TF runs its own ring)",
                "mpi_busy_wait": "OpenMPI's waiting", "cpu_operations": "Horovod's data path",
                "no_allreduce": "Horovod's measurement switch",
                "elastic": "Horovod's elastic mode", "commit_every": "Horovod's elastic commits"}


def check_backend(args):
    """One line for a flag the chosen backend cannot honour."""
    if args.backend == "tf-collective":
        for dest, what in HOROVOD_ONLY.items():
            if getattr(args, dest) not in (None, False):
                raise UsageError(f"--{dest.replace('_', '-')} is {what}: drop it with --backend tf-collective")
    else:
        if args.cpu_operations == "mpi" and os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
            raise UsageError("--cpu-operations mpi needs MPI: launch with mpirun (or horovodrun --mpi), "
                             "not horovodrun --gloo")
        for dest in ("communication", "port_base"):
            if getattr(args, dest) is not None:
                raise UsageError(f"--{dest.replace('_', '-')} is for TF's collective mode: it needs --backend "
                                 "tf-collective")


def validate(args):
    check_backend(args)
    check_outputs(args)  # before the training, not at its first save
    check_straggler(args.straggler, launched_size() or 1)  # now, not seconds later once Horovod or TF has started
    if args.elastic and os.environ.get("HOROVOD_ELASTIC") != "1":
        raise UsageError("--elastic runs under horovodrun's elastic mode: horovodrun --gloo -np N --min-np M "
                         "--max-np X --host-discovery-script S ringtrain --elastic ...")


def _main(argv):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from ringtrain import doctor
        return doctor.main(argv[1:])
    args = parser().parse_args(argv)
    PREEMPTION.install("ringtrain")  # a scheduler's signal: ends at once, or, once training runs, saves first
    validate(args)
    # Data and flags are checked before TensorFlow loads: bad input fails in
    # well under a second, on every rank alike, so no rank waits on another.
    dataset = flags.load_training_data(args, workers=launched_size() or 1)
    return modes.chosen("ringtrain", args).load()(config.from_args(args), args, dataset)


def main(argv=None):
    return run_cli("ringtrain", _main, argv)
