"""pytest configuration. Shared helpers live in tests/helpers.py."""
import signal

import pytest


def pytest_configure(config):
    # A background job of a non-interactive shell (`make test &` in a script) starts with
    # SIGINT ignored, and every process it starts would inherit that. The tests that press
    # Ctrl-C on a launcher act as a person at a terminal, so SIGINT gets its usual handler.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line("markers", "slow: starts a launcher, trains, builds a cluster or runs a bench "
                                       "(`pytest -m 'not slow'`, `make test-quick`, is the rest: under a minute)")
    config.addinivalue_line("markers", "alone: measures time or CPU, so `make test` runs it by itself, after "
                                       "the others have run two at a time")


def _three_hosts(prefix):
    """A simulated cluster of 3 hosts (multihost.simcluster), torn down when
    its user is done; skipped, with the reason, where network namespaces
    cannot be made."""
    import os
    from ringtrain.multihost import simcluster
    from ringtrain.common.errors import UsageError
    try:
        simcluster.check_can_build()
    except UsageError as e:
        pytest.skip(f"no simulated cluster here: {e}")
    name = f"{prefix}{os.getpid() % 100000}"
    built = simcluster.up(name, 3, simcluster.Link("10gbit"), log=lambda line: None)
    try:
        yield built
    finally:
        simcluster.down(name, quiet=True)


@pytest.fixture(scope="session")
def cluster():
    """3 hosts, built on first use and shared by the test run."""
    yield from _three_hosts("rtt")


@pytest.fixture
def cluster_to_crash():
    """3 hosts for one test that may pull a host's plug (simcluster.crash)."""
    yield from _three_hosts("rtc")


@pytest.fixture(scope="session")
def mnist_records(tmp_path_factory):
    """The embedded MNIST digits as TFRecords, as TensorFlow's writer writes them:
    train-0000i-of-00004 (4000 digits, in a random order) and validation-* (1000).
    The glob of the training files."""
    from ringtrain.workloads import data, writers
    folder = tmp_path_factory.mktemp("mnist-records")
    digits = data.load("mnist")
    writers.write_tfrecords(digits.train_images, digits.train_labels, str(folder / "train"), files=4)
    writers.write_tfrecords(digits.test_images, digits.test_labels, str(folder / "validation"), files=2)
    return str(folder / "train-*")


# The files that take longest, longest first (measured: DEVELOPERS.md 4.13). With
# `--no-loadscope-reorder` (the Makefile), pytest-xdist hands files out in this order, so
# no worker is left running a long file at the end while the other idles (longest first);
# by default it orders files by their number of tests, and test_slurm.py, few and long,
# came last. The other files keep their order.
LONGEST_FIRST = ("test_mode_table.py", "test_slurm.py", "test_cluster.py", "test_own_models.py", "test_keras.py",
                 "test_preemption.py", "test_cluster_bench.py", "test_bench.py", "test_ps_fault_tolerance.py",
                 "test_correctness.py", "test_ring_checkpoints.py")


def pytest_collection_modifyitems(items):
    place = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: place.get(item.path.name, len(place)))  # (stable: a file's tests keep their order)
