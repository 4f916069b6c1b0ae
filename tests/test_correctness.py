"""Synchronous data parallelism is correct under every launcher: 2 ranks at
batch b end with identical weights (bit for bit) that equal one process
trained on batch 2b, to float tolerance. One run per launcher proves both,
for Horovod (MPI and Gloo) and for TensorFlow's collective mode, on this
machine or across simulated hosts (horovodrun and mpirun's TF collective
mode run only there: on one machine they carry the same data path as mpirun
and TF_CONFIG's); two of them as 2 micro-batches of b/2 per
update (--accumulate 2), Horovod's and TF's. TF's collective mode runs once
with its gradients in one packed all-reduce (--bucket-mb 0, TF's own
default) and once in several buckets (mnist_mlp's 2.6 MB in 0.25 MB ones);
ring mode in its default buckets (its small gradients in one grouped
allreduce, its two large kernels alone) and once each gradient alone
(--bucket-mb 0, under horovodrun across hosts): all equal the one process,
so the buckets change no weight. TF's exchange with the first layers'
gradients in a last bucket of their own is checked sum by sum on 2 ranks."""
import json
import os

import pytest

from helpers import (BIN, ENV, ONE_THREAD, Tasks, assert_every_check_ok, assert_same_weights, horovodrun, mpirun,
                     on_two_ranks, run_ok, weights)
from ringtrain.multihost.net import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# SGD, no lr scaling or warm-up, no dropout: the updates are a pure function of the data.
DETERMINISTIC = ["--model", "mnist_mlp", "--optimizer", "sgd", "--lr", "0.05", "--no-lr-scaling",
                 "--warmup-epochs", "0", "--no-dropout", "--log-every", "1000", "--steps", "8", *ONE_THREAD]
COLLECTIVE = ["--backend", "tf-collective"]
PACKED, BUCKETED = ["--bucket-mb", "0"], ["--bucket-mb", "0.25"]


@pytest.fixture(scope="module")
def one_process_on_the_global_batch(tmp_path_factory):
    """The reference: one process, batch 32."""
    dump = str(tmp_path_factory.mktemp("one") / "w-{rank}.npz")
    run_ok([os.path.join(BIN, "ringtrain"), *DETERMINISTIC, "--batch-size", "32", "--dump-weights", dump])
    return weights(dump, 0)


# Two launchers' runs take each update as 2 micro-batches of 8 (--accumulate 2): the same updates.
ACCUMULATED = {"horovodrun-gloo", "tf-collective-tf-config"}


def on_this_machine(launcher, dump, tmp_path):
    batch = ["--batch-size", "8", "--accumulate", "2"] if launcher in ACCUMULATED else ["--batch-size", "16"]
    args = [*DETERMINISTIC, *batch, "--dump-weights", dump]
    if launcher == "tf-collective-tf-config":
        return tf_config_workers([*args, *PACKED], tmp_path)
    cmd = {"horovodrun-gloo": lambda: horovodrun(2, *args, gloo=True),
           "mpirun": lambda: mpirun(2, *args)}[launcher]()
    run_ok(cmd, timeout=240)


def tf_config_workers(args, tmp_path):
    """TF's collective mode as TF's documentation launches it: one process per
    worker, each with TF_CONFIG naming the cluster and its own index."""
    workers = [f"localhost:{port}" for port in free_ports(2)]
    with Tasks(str(tmp_path)) as tasks:
        for index in range(2):
            tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
            tasks.start(f"worker{index}", ["env", f"TF_CONFIG={tf_config}", os.path.join(BIN, "ringtrain"),
                                           *COLLECTIVE, *args])
        for index in range(2):
            assert tasks.wait(f"worker{index}", 240) == 0, tasks.log(f"worker{index}")[-3000:]


@pytest.mark.parametrize("launcher", ["horovodrun-gloo", "mpirun", "tf-collective-tf-config"])
def test_two_ranks_are_identical_and_equal_one_process_on_the_global_batch(
        launcher, tmp_path, one_process_on_the_global_batch):
    dump = str(tmp_path / "w-{rank}.npz")
    on_this_machine(launcher, dump, tmp_path)
    assert_same_weights(weights(dump, 0), weights(dump, 1), exact=True)
    assert_same_weights(weights(dump, 0), one_process_on_the_global_batch)


# what carried the gradients, and what coordinated: under mpirun across hosts Gloo, unless asked for OpenMPI
CARRIED = {"mpirun-hostfile": ("gloo ring", "gloo"), "mpirun-hostfile-mpi-ops": ("mpi ring", "mpi"),
           "horovodrun-gloo": ("gloo ring", "gloo")}


@pytest.mark.parametrize("launcher", ["mpirun-hostfile", "mpirun-hostfile-mpi-ops", "horovodrun", "horovodrun-gloo",
                                      "tf-collective-mpirun"])
def test_across_hosts_too(cluster, launcher, tmp_path, one_process_on_the_global_batch):
    from helpers import last_json
    hosts = tmp_path / "hosts"
    hosts.write_text("h1 slots=1\nh2 slots=1\n")
    ringtrain = os.path.join(BIN, "ringtrain")
    start = {"mpirun-hostfile": ["mpirun", "--hostfile", str(hosts), ringtrain],
             "mpirun-hostfile-mpi-ops": ["mpirun", "--hostfile", str(hosts), ringtrain, "--cpu-operations", "mpi"],
             "tf-collective-mpirun": ["mpirun", "--hostfile", str(hosts), ringtrain, *COLLECTIVE, *BUCKETED],
             "horovodrun": [os.path.join(BIN, "horovodrun"), "-H", "h1:1,h2:1", ringtrain, "--bucket-mb", "0"],
             "horovodrun-gloo": [os.path.join(BIN, "horovodrun"), "--gloo", "-H", "h1:1,h2:1", ringtrain]}[launcher]
    dump, summary = str(tmp_path / "w-{rank}.npz"), tmp_path / "s.json"
    on = [os.path.join(BIN, "ringtrain-cluster"), "--name", cluster.name, "exec", "h1", "--"]
    run_ok([*on, *start, *DETERMINISTIC, "--batch-size", "16", "--dump-weights", dump, "--summary-json",
            str(summary)], timeout=240, env=ENV)
    assert last_json(summary.read_text())["hosts"] == ["h1", "h2"]
    if launcher in CARRIED:
        said = last_json(summary.read_text())
        assert (said["allreduce_algorithm"], said["controller"]) == CARRIED[launcher]
    assert_same_weights(weights(dump, 0), weights(dump, 1), exact=True)
    assert_same_weights(weights(dump, 0), one_process_on_the_global_batch)


def test_tf_collective_buckets_sum_every_gradient_the_first_layers_last_and_alone():
    """TF collective mode's exchange on 2 ranks (tests/scripts/tf_exchange.py): the
    mnist_mlp runs above never make a last bucket of the first layers' alone (their
    first layer is their largest)."""
    assert_every_check_ok(on_two_ranks("tf_exchange.py"), ["one-pack", "buckets-first-layers-last",
                                                         "fits-one-bucket"])
