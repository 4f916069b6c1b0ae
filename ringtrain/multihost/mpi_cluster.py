"""A TensorFlow cluster from the processes mpirun started: each rank picks a
free port on its own host, and the ranks share their host:port through MPI,
so that a TF job (TF's collective mode, a PS job) needs no launcher of its
own under `mpirun -np N` or `mpirun --hostfile F`, or a scheduler's `srun`."""
import os
import socket

from ringtrain.multihost.net import free_ports

MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def under_mpi():
    """Whether an MPI launcher (mpirun, srun --mpi=...) started this process."""
    return any(name in os.environ for name in MPI_RANK_VARIABLES)


def addresses():
    """(this rank, ["host:port" of every rank, in rank order]). The host is the
    name each rank's host goes by (what the hostfile's hosts resolve), or
    localhost when every rank runs on one host; the port is a free one there."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    port = free_ports(1, host="")[0]
    ranks = comm.allgather((socket.gethostname(), port))
    rank = comm.Get_rank()
    # MPI's part ends here: finalized now, a rank that ends first exits at once instead
    # of waiting in MPI_Finalize for the last (mpirun still ends the job if one fails).
    MPI.Finalize()
    one_host = len({host for host, _ in ranks}) == 1
    return rank, [f"{'localhost' if one_host else host}:{port}" for host, port in ranks]
