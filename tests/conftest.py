"""pytest configuration. Shared helpers live in tests/helpers.py."""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts a launcher, trains, builds a cluster or runs a bench "
                                       "(`pytest -m 'not slow'`, `make test-quick`, is the rest: under a minute)")


@pytest.fixture(scope="session")
def cluster():
    """A simulated cluster of 3 hosts (multihost.simcluster), built on first
    use and torn down at the end of the test run; skipped, with the reason,
    where network namespaces cannot be made."""
    import os
    from ringtrain.multihost import simcluster
    from ringtrain.workloads.errors import UsageError
    try:
        simcluster.check_can_build()
    except UsageError as e:
        pytest.skip(f"no simulated cluster here: {e}")
    name = f"rtt{os.getpid() % 100000}"
    built = simcluster.up(name, 3, simcluster.Link("10gbit"), log=lambda line: None)
    try:
        yield built
    finally:
        simcluster.down(name, quiet=True)
