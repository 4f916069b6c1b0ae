"""The reference ring-allreduce equals MPI_Allreduce: exactly on integers,
within tolerance on floats, for any N and sizes that do not divide evenly."""
import os
import sys

import pytest

from ringtrain.bench.launch import child_env, mpirun
from ringtrain.bench.ring_reference import chunk_bounds
from helpers import run


@pytest.mark.parametrize("count,size", [(0, 3), (1, 4), (10, 3), (12, 4), (7, 7), (1000, 6)])
def test_chunks_cover_the_buffer_once_and_differ_by_at_most_one(count, size):
    bounds = chunk_bounds(count, size)
    assert len(bounds) == size
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    lengths = [hi - lo for lo, hi in bounds]
    assert max(lengths) - min(lengths) <= 1


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_ring_allreduce_equals_mpi_allreduce(ranks):
    cmd = mpirun(ranks, [sys.executable, "-m", "ringtrain.bench.ring_reference"], cores=os.cpu_count() or 1)
    done = run(cmd, timeout=100, env=child_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"ring_allreduce == MPI_Allreduce on {ranks} ranks" in done.stdout
