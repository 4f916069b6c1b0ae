"""Horovod's knobs and the learning-rate recipe, mapped from ringtrain's flags."""
import os


def yield_when_idle():
    """OpenMPI busy-polls while a rank waits in a collective; Horovod's
    background thread waits in one every cycle. On CPU ranks that share
    cores with TF's compute, that spinning steals the compute's time."""
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


def apply_before_init(args):
    """Horovod and MPI read these from the environment in hvd.init()."""
    if not args.mpi_busy_wait:
        yield_when_idle()
    if args.fusion_threshold_mb is not None:
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        os.environ["HOROVOD_CYCLE_TIME"] = str(args.cycle_time_ms)
    if args.timeline:
        os.environ["HOROVOD_TIMELINE"] = os.path.abspath(args.timeline)


def learning_rate_schedule(args, size, steps_per_epoch):
    """lr(step): scaled by the rank count (Goyal et al., 2017), reached by a
    linear warm-up from the single-worker lr. Adasum combines gradients
    without growing their magnitude, so it is not scaled on CPU."""
    scale = 1 if args.no_lr_scaling or args.adasum else size
    target = args.lr * scale
    warmup_steps = int(args.warmup_epochs * steps_per_epoch)

    def lr_at(step):
        if warmup_steps <= 0 or step >= warmup_steps:
            return target
        return args.lr + (target - args.lr) * step / warmup_steps

    return lr_at
