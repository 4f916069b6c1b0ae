"""Who started this process, and the TensorFlow cluster that its fellow
ranks make: mpirun (or `srun --mpi=pmix`), whose ranks choose free ports and
share them through MPI, or a plain SLURM `srun`, whose tasks serve on fixed
ports. A TF job (TF's collective mode, a PS job) then needs no launcher of
its own."""
from ringtrain.multihost import mpi_cluster, slurm_step
from ringtrain.multihost.slurm_step import DEFAULT_PORT_BASE


def launcher():
    """"mpirun" (any MPI launcher), "srun" (a SLURM step without MPI) or None."""
    if mpi_cluster.under_mpi():
        return "mpirun"
    if slurm_step.under_srun():
        return "srun"
    return None


def addresses(port_base=DEFAULT_PORT_BASE):
    """(this process's rank, [host:port of every rank, in rank order])."""
    if mpi_cluster.under_mpi():
        return mpi_cluster.addresses()
    return slurm_step.addresses(port_base)
