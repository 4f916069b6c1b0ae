"""The install: doctor's verdict, and Horovod's TF API on Keras 3 variables."""
import os

import pytest

from helpers import BIN, SCRIPTS, json_objects, run_ok

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_doctor_finds_tensorflow_mpi_and_gloo():
    out = run_ok([os.path.join(BIN, "ringtrain"), "doctor"])
    assert "horovod controllers    MPI, Gloo" in out
    assert "tensorflow             2." in out
    assert "mpirun -np 2           ok" in out
    # where servers would listen: root here, so launch's tasks get a private namespace
    expected = "private network namespace with loopback only" if os.geteuid() == 0 else "WARNING"
    assert expected in next(line for line in out.splitlines() if line.startswith("ps-baseline launch"))
    assert "rendezvous server listens on every interface" in out
    assert out.strip().endswith("ring mode: ready")


@pytest.mark.parametrize("gloo", [False, True])
def test_horovod_trains_keras3_models_with_identical_weights_on_both_ranks(gloo):
    cmd = [os.path.join(BIN, "horovodrun"), "-np", "2", *(["--gloo"] if gloo else []),
           os.path.join(BIN, "python"), os.path.join(SCRIPTS, "keras3_horovod.py")]
    out = run_ok(cmd)
    ranks = [found for line in out.splitlines() if '"rank"' in line for found in json_objects(line)]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    # Broadcast, DistributedGradientTape, PartialDistributedGradientTape and
    # SyncBatchNormalization (global moments) all keep the ranks in lockstep.
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    assert ranks[0]["bn_moving_mean_sha256"] == ranks[1]["bn_moving_mean_sha256"]
