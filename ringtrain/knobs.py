"""Horovod's and OpenMPI's knobs, mapped from ringtrain's flags to the environment."""
import os

from ringtrain.workloads.horovod_env import cpu_operations_env, gloo_timeout_env, knob_env, ringtrains_mpi_env
from ringtrain.workloads.outputs import parent_made


def apply_before_init(horovod, stall_timeout):
    """Horovod and MPI read these from the environment in hvd.init()."""
    for name, value in dict(ringtrains_mpi_env(horovod.mpi_allreduce, horovod.mpi_busy_wait),
                            **cpu_operations_env(horovod.cpu_operations)).items():
        os.environ.setdefault(name, value)  # a user's own setting wins
    for name, value in gloo_timeout_env(stall_timeout).items():  # (once the controller is chosen)
        os.environ.setdefault(name, value)
    timeline = os.path.abspath(parent_made(horovod.timeline)) if horovod.timeline else None
    os.environ.update(knob_env(horovod.cycle_time_ms, horovod.fusion_threshold_mb, timeline, horovod.horovod_loop))
