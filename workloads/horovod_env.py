"""Horovod's and OpenMPI's knobs as the environment variables they read in
hvd.init() / MPI_Init: one mapping for the trainer and the bench."""

# OpenMPI busy-polls while a rank waits in a collective, and Horovod's
# background thread waits in one every cycle: on CPU ranks that share cores
# with TF's compute, that spinning steals the compute's time.
MPI_YIELD_WHEN_IDLE = {"OMPI_MCA_mpi_yield_when_idle": "1"}


def knob_env(cycle_time_ms=None, fusion_threshold_mb=None, timeline=None):
    """{HOROVOD_*: value} for the knobs that are set (None: Horovod's default)."""
    env = {}
    if cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{cycle_time_ms:g}"
    if fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(fusion_threshold_mb * (1 << 20)))
    if timeline:
        env["HOROVOD_TIMELINE"] = timeline
    return env
