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
