"""A reference ring-allreduce in numpy + mpi4py, as the seeds describe it:
the buffer is cut into N chunks; N-1 scatter-reduce steps leave each rank
owning one fully reduced chunk; N-1 allgather steps pass the reduced chunks
round the ring until every rank has all of them.

Each rank sends 2(N-1)/N of the buffer in total, whatever N is: the reason
the ring's bus bandwidth does not fall as ranks are added.

    from mpi4py import MPI
    from bench.ring_reference import ring_allreduce
    total = ring_allreduce(MPI.COMM_WORLD, np.arange(10.0))   # == MPI_Allreduce(SUM)
"""
import numpy as np
from mpi4py import MPI


def chunk_bounds(count, size):
    """[start, stop) of each of `size` chunks of `count` elements; the first
    count % size chunks get one extra element (sizes need not divide)."""
    base, extra = divmod(count, size)
    stops = np.cumsum([base + (i < extra) for i in range(size)])
    return [(int(stop - (base + (i < extra))), int(stop)) for i, stop in enumerate(stops)]


def ring_allreduce(comm, array, op=np.add):
    """Reduce `array` elementwise over every rank of `comm` with the ufunc
    `op` (np.add, np.maximum, np.minimum). Returns a new array, same shape and
    dtype, identical on every rank."""
    result = np.array(array, copy=True, order="C").reshape(-1)
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1 or result.size == 0:
        return result.reshape(np.shape(array))
    scatter_reduce(comm, result, op)
    allgather(comm, result)
    return result.reshape(np.shape(array))


def _neighbours(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    return (rank + 1) % size, (rank - 1) % size


def _as_bytes(a):
    # Raw bytes: point-to-point needs no MPI datatype, so any numpy dtype works.
    return [a.view(np.uint8), MPI.BYTE]


def scatter_reduce(comm, flat, op=np.add):
    """Step s: send chunk (rank - s) to the right, receive chunk (rank - s - 1)
    from the left and reduce it into ours. Afterwards chunk (rank + 1) % N
    holds the full reduction."""
    size, rank = comm.Get_size(), comm.Get_rank()
    right, left = _neighbours(comm)
    bounds = chunk_bounds(flat.size, size)
    incoming = np.empty(max(b - a for a, b in bounds), dtype=flat.dtype)
    for step in range(size - 1):
        send_lo, send_hi = bounds[(rank - step) % size]
        recv_lo, recv_hi = bounds[(rank - step - 1) % size]
        received = incoming[:recv_hi - recv_lo]
        comm.Sendrecv(_as_bytes(flat[send_lo:send_hi]), dest=right, sendtag=step,
                      recvbuf=_as_bytes(received), source=left, recvtag=step)
        target = flat[recv_lo:recv_hi]
        op(target, received, out=target)


def allgather(comm, flat):
    """Step s: send the reduced chunk (rank + 1 - s) to the right, receive
    chunk (rank - s) from the left straight into place."""
    size, rank = comm.Get_size(), comm.Get_rank()
    right, left = _neighbours(comm)
    bounds = chunk_bounds(flat.size, size)
    for step in range(size - 1):
        send_lo, send_hi = bounds[(rank + 1 - step) % size]
        recv_lo, recv_hi = bounds[(rank - step) % size]
        comm.Sendrecv(_as_bytes(flat[send_lo:send_hi]), dest=right, sendtag=size + step,
                      recvbuf=_as_bytes(flat[recv_lo:recv_hi]), source=left, recvtag=size + step)
