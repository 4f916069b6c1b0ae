"""Horovod's knobs and the learning-rate recipe, mapped from ringtrain's flags."""
import os

from ringtrain.workloads.horovod_env import MPI_TCP_LINKS, MPI_YIELD_WHEN_IDLE, knob_env, mpi_allreduce_env
from ringtrain.workloads.outputs import parent_made


def apply_before_init(args):
    """Horovod and MPI read these from the environment in hvd.init()."""
    mpi_env = dict(mpi_allreduce_env(args.mpi_allreduce), **MPI_TCP_LINKS,
                   **({} if args.mpi_busy_wait else MPI_YIELD_WHEN_IDLE))
    for name, value in mpi_env.items():
        os.environ.setdefault(name, value)  # a user's own setting wins
    timeline = os.path.abspath(parent_made(args.timeline)) if args.timeline else None
    os.environ.update(knob_env(args.cycle_time_ms, args.fusion_threshold_mb, timeline, args.horovod_loop))


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
