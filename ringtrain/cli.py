"""`ringtrain`: the ring-allreduce trainer, and `ringtrain doctor`."""
import os
import sys

from ringtrain.workloads import flags
from ringtrain.workloads.errors import TrainingStopped, UsageError, launched_rank, run_cli
from ringtrain.workloads.horovod_env import HOROVOD_LOOPS, MPI_ALLREDUCE_ALGORITHMS
from ringtrain.workloads.outputs import check_outputs

EXAMPLES = """examples:
  horovodrun -np 2 ringtrain --model mnist_cnn --epochs 5
  horovodrun --gloo -np 2 ringtrain --model mnist_cnn --epochs 5
  mpirun -np 2 ringtrain --model mnist_mlp --epochs 2
  mpirun --hostfile mpi_hostfiles/localhost ringtrain --model mnist_cnn
  ringtrain --model cifar_resnet --data-dir ~/data/cifar10 --epochs 30 --checkpoint-dir ckpt
  horovodrun -np 4 ringtrain --checkpoint-dir ckpt --resume     # continue on any N
  ringtrain doctor                                               # check the install
"""


def parser():
    p = flags.OneLineParser(
        prog="ringtrain", epilog=EXAMPLES,
        formatter_class=flags.argparse.RawDescriptionHelpFormatter,
        description="Synchronous data-parallel training over Horovod's ring-allreduce "
                    "(scatter-reduce then allgather). Launch with horovodrun or mpirun; "
                    "alone it runs one rank.")
    flags.add_training_flags(p)
    r = p.add_argument_group("ring mode (Horovod)")
    r.add_argument("--no-lr-scaling", action="store_true",
                   help="keep --lr as is instead of multiplying it by the rank count")
    r.add_argument("--warmup-epochs", type=flags.non_negative_float, default=1.0, metavar="E",
                   help="ramp the lr from --lr to lr*N over E epochs (default 1; 0 disables)")
    r.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16")
    r.add_argument("--adasum", action="store_true", help="combine gradients with Adasum")
    r.add_argument("--fusion-threshold-mb", type=flags.non_negative_float, metavar="MB",
                   help="Horovod tensor-fusion buffer (HOROVOD_FUSION_THRESHOLD; default 128)")
    r.add_argument("--cycle-time-ms", type=flags.positive_float, metavar="MS",
                   help="Horovod background cycle (HOROVOD_CYCLE_TIME; default 1 ms)")
    r.add_argument("--horovod-loop", choices=sorted(HOROVOD_LOOPS), default=None,
                   help="Horovod's background thread: event (ringtrain's patch, the default) sleeps "
                        "until a tensor is queued; upstream runs a coordination round every cycle "
                        "(HOROVOD_EVENT_DRIVEN_LOOP)")
    r.add_argument("--timeline", "--horovod-timeline", metavar="FILE",
                   help="write a Horovod timeline (chrome://tracing); under horovodrun, which "
                        "claims --timeline itself, spell it --horovod-timeline")
    r.add_argument("--mpi-allreduce", choices=sorted(MPI_ALLREDUCE_ALGORITHMS) + ["default"], default="ring",
                   metavar="ALG", help="OpenMPI's allreduce algorithm for the gradients: ring (default: "
                   "scatter-reduce then allgather, as the seeds describe), rabenseifner, recursive_doubling, "
                   "segmented_ring, ..., or default (OpenMPI picks by size and ranks); not used under Gloo")
    r.add_argument("--mpi-busy-wait", action="store_true",
                   help="let OpenMPI spin while waiting (its default); ringtrain otherwise sets "
                        "OMPI_MCA_mpi_yield_when_idle=1, which is faster when ranks share cores")
    r.add_argument("--on-nan", choices=("stop", "skip"), default="stop",
                   help="a non-finite loss or gradient: stop at once with the step, the rank and the "
                        "last good checkpoint (default), or skip that update and go on")
    r.add_argument("--stall-timeout", type=flags.non_negative_float, default=120.0, metavar="S",
                   help="no step on any rank for S seconds ends the job, naming the rank that stopped "
                        "(an out-of-band watchdog: Horovod's own waits with the frozen collective); "
                        "0 disables (default %(default)g)")
    r.add_argument("--elastic", action="store_true",
                   help="go on when ranks are lost or added, under horovodrun's elastic mode (horovodrun "
                        "--gloo -np N --min-np M --max-np X --host-discovery-script S ringtrain --elastic)")
    r.add_argument("--commit-every", type=flags.positive_int, default=10, metavar="K",
                   help="--elastic: commit the state every K steps; a lost rank costs at most K steps "
                        "(default %(default)s)")
    r.add_argument("--no-allreduce", action="store_true",
                   help="measurement only: skip the gradient allreduce, so ranks diverge "
                        "(Horovod's background thread still coordinates every cycle)")
    c = p.add_argument_group("checkpoints and logs (rank 0 writes them)")
    c.add_argument("--checkpoint-every", type=flags.positive_int, default=100, metavar="K",
                   help="checkpoint every K steps and at the end (default %(default)s)")
    c.add_argument("--keep-checkpoints", type=flags.positive_int, default=3, metavar="K")
    c.add_argument("--resume", nargs="?", const="latest", metavar="CKPT",
                   help="continue from CKPT (a prefix or directory), or with no value from "
                        "the newest checkpoint in --checkpoint-dir, if any; works on any N")
    c.add_argument("--log-dir", metavar="DIR", help="TensorBoard scalars")
    c.add_argument("--dump-weights", metavar="FILE",
                   help="save each rank's final weights to FILE ({rank} is replaced)")
    return p


def validate(args):
    if args.resume == "latest" and not args.checkpoint_dir:
        raise UsageError("--resume without a checkpoint needs --checkpoint-dir")
    check_outputs(args)  # before the training, not at its first save
    if args.epochs == 0 and not args.steps:
        raise UsageError("--epochs 0 trains nothing: give --epochs >= 1 or --steps K")
    if args.elastic and os.environ.get("HOROVOD_ELASTIC") != "1":
        raise UsageError("--elastic runs under horovodrun's elastic mode: horovodrun --gloo -np N --min-np M "
                         "--max-np X --host-discovery-script S ringtrain --elastic ...")


def _main(argv):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from ringtrain import doctor
        return doctor.main(argv[1:])
    args = parser().parse_args(argv)
    validate(args)
    # Data and flags are checked before TensorFlow loads: bad input fails in
    # well under a second, on every rank alike, so no rank waits on another.
    dataset = flags.load_training_data(args)
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    import_tensorflow_quietly()
    if args.elastic:
        from ringtrain.elastic import train
        return train(args, dataset)
    from ringtrain.train import train
    try:
        return train(args, dataset)
    except Exception as e:
        if "Horovod has been shut down" not in str(e):
            raise
        # A peer died mid-collective: what the launcher says next names it; say it in one line here.
        rank = launched_rank()
        raise TrainingStopped(f"{'rank ' + str(rank) + ': ' if rank is not None else ''}a collective failed: "
                              "another rank, or its host, is gone (Horovod has been shut down); the job ends: "
                              "resume with --resume from the last checkpoint, or run with --elastic") from None


def main(argv=None):
    return run_cli("ringtrain", _main, argv)
