"""A reference ring-allreduce in numpy + mpi4py, as the classic distributed-TensorFlow tutorials describe it:
the buffer is cut into N chunks; N-1 scatter-reduce steps leave each rank
owning one fully reduced chunk; N-1 allgather steps pass the reduced chunks
round the ring until every rank has all of them.

Each rank sends 2(N-1)/N of the buffer in total, whatever N is: the reason
the ring's bus bandwidth does not fall as ranks are added.

    from mpi4py import MPI
    from ringtrain.bench.ring_reference import ring_allreduce
    total = ring_allreduce(MPI.COMM_WORLD, np.arange(10.0))   # == MPI_Allreduce(SUM)
"""
import numpy as np

# (mpi4py is imported where a communicator is used: `from mpi4py import MPI` is MPI_Init, and
# a process that only reads chunk_bounds, such as a test's, would become a singleton MPI job,
# its orted started and OpenMPI's variables set in its environment for every child it runs)


def chunk_bounds(count, size):
    """[start, stop) of each of `size` chunks of `count` elements; the first
    count % size chunks get one extra element (sizes need not divide)."""
    base, extra = divmod(count, size)
    stops = np.cumsum([base + (i < extra) for i in range(size)])
    return [(int(stop - (base + (i < extra))), int(stop)) for i, stop in enumerate(stops)]


def ring_allreduce(comm, array, op=np.add, out=None):
    """Reduce `array` elementwise over every rank of `comm` with the ufunc
    `op` (np.add, np.maximum, np.minimum). Returns `out` (or a new array),
    same shape and dtype, identical on every rank. Pass the same `out` on
    every call, as MPI_Allreduce users pass a receive buffer: a fresh
    multi-megabyte array costs a page fault per 4 KB on first touch, which
    here cost more than the allreduce itself."""
    local = np.ascontiguousarray(array).reshape(-1)
    if out is None:
        out = np.empty_like(local).reshape(np.shape(array))
    if not out.flags.c_contiguous or out.size != local.size or out.dtype != local.dtype:
        raise ValueError("out must be a C-contiguous array of the input's size and dtype")
    result = out.reshape(-1)  # a view of `out`
    if comm.Get_size() == 1 or local.size == 0:
        result[...] = local
    else:
        scatter_reduce(comm, local, result, op)
        allgather(comm, result)
    return out


def _neighbours(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    return (rank + 1) % size, (rank - 1) % size


def _as_bytes(a):
    # Raw bytes: point-to-point needs no MPI datatype, so any numpy dtype works.
    from mpi4py import MPI
    return [a.view(np.uint8), MPI.BYTE]


def scatter_reduce(comm, local, result, op=np.add):
    """Step s: send chunk (rank - s) to the right, receive chunk (rank - s - 1)
    from the left and reduce our own contribution into it. Afterwards chunk
    (rank + 1) % N of `result` holds the full reduction. `local` is only
    read: the first send comes straight from it, and each reduction writes
    into `result`, so no up-front copy of the buffer is needed."""
    size, rank = comm.Get_size(), comm.Get_rank()
    right, left = _neighbours(comm)
    bounds = chunk_bounds(local.size, size)
    for step in range(size - 1):
        send_lo, send_hi = bounds[(rank - step) % size]
        recv_lo, recv_hi = bounds[(rank - step - 1) % size]
        outgoing = (local if step == 0 else result)[send_lo:send_hi]
        # received straight into its place in `result`: a different chunk from
        # the one being sent, so no scratch buffer is needed
        received = result[recv_lo:recv_hi]
        comm.Sendrecv(_as_bytes(outgoing), dest=right, sendtag=step,
                      recvbuf=_as_bytes(received), source=left, recvtag=step)
        op(local[recv_lo:recv_hi], received, out=received)


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


def check_against_mpi(comm, sizes=(0, 1, 2, 3, 5, 7, 64, 1000, 12345), seed=0):
    """Compare ring_allreduce with MPI_Allreduce on this communicator: exact
    for integers (sum, max, min), within float tolerance for floats (sum).
    Returns a list of failure messages (empty: all equal)."""
    from mpi4py import MPI
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    cases = [(np.int32, np.add, MPI.SUM), (np.int64, np.add, MPI.SUM),
             (np.int64, np.maximum, MPI.MAX), (np.int64, np.minimum, MPI.MIN),
             (np.float32, np.add, MPI.SUM), (np.float64, np.add, MPI.SUM)]
    for count in list(sizes) + [size - 1, size + 1, 3 * size + 2]:
        for dtype, ufunc, mpi_op in cases:
            rng = np.random.default_rng([seed, rank, count])
            if np.issubdtype(dtype, np.integer):
                local = rng.integers(-10**6, 10**6, count).astype(dtype)
            else:
                local = rng.standard_normal(count).astype(dtype)
            expected = np.empty_like(local)
            comm.Allreduce(local, expected, op=mpi_op)
            # every other case reuses a dirty output buffer, as the bench does
            out = np.full_like(local, 7) if count % 2 else None
            got = ring_allreduce(comm, local, ufunc, out=out)
            if out is not None and got is not out:
                failures.append(f"rank {rank}: out= was not used for count={count}")
            same_everywhere = comm.allreduce(got.tobytes(), op=MPI.MAX) == got.tobytes()
            if np.issubdtype(dtype, np.integer):
                ok = np.array_equal(got, expected)
            else:
                tol = 1e-5 if dtype == np.float32 else 1e-12
                ok = np.allclose(got, expected, rtol=tol, atol=tol * size)
            if not ok or got.dtype != local.dtype or got.shape != local.shape:
                failures.append(f"rank {rank}: {np.dtype(dtype).name} {ufunc.__name__} count={count} differs")
            if not same_everywhere:
                failures.append(f"rank {rank}: {np.dtype(dtype).name} count={count} differs between ranks")
    matrix = np.arange(12, dtype=np.int64).reshape(3, 4) * (rank + 1)
    if not np.array_equal(ring_allreduce(comm, matrix), np.arange(12).reshape(3, 4) * size * (size + 1) // 2):
        failures.append(f"rank {rank}: a 3x4 array lost its shape or values")
    return failures


if __name__ == "__main__":
    # mpirun -np N python -m ringtrain.bench.ring_reference   (exit 0: equal to MPI_Allreduce)
    import sys
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    problems = check_against_mpi(world)
    every = world.gather(problems, root=0)
    if world.Get_rank() == 0:
        flat = [p for ps in every for p in ps]
        print("\n".join(flat) if flat else f"ring_allreduce == MPI_Allreduce on {world.Get_size()} ranks")
        sys.exit(1 if flat else 0)
    sys.exit(1 if problems else 0)
