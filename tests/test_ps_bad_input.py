"""Bad cluster input: one line naming the problem, exit 2, within seconds; never a hang."""
import socket

import pytest

from helpers import (PS_BASELINE, TINY, assert_one_line_error as one_line_error, hosts, ps_and_worker_hosts,
                     task_args)

FAST = 10  # seconds: these fail before TensorFlow is imported


def assert_one_line_error(cmd, expected, within=FAST):
    one_line_error(cmd, expected, within, code=2)


@pytest.mark.timeout(60)
def test_task_index_out_of_range():
    assert_one_line_error(task_args(*ps_and_worker_hosts(1, 2), "worker", 2), "--task_index 2 is out of range")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", ["localhost", "localhost:", ":2222", "localhost:http", "localhost:70000"])
def test_malformed_host_port(bad):
    assert_one_line_error(task_args(bad, hosts(1), "ps", 0), bad)


@pytest.mark.timeout(60)
def test_duplicate_port():
    worker_hosts = hosts(1)
    assert_one_line_error(task_args(worker_hosts, worker_hosts, "ps", 0), "is given to both")


@pytest.mark.timeout(60)
def test_busy_port():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        address = f"localhost:{busy.getsockname()[1]}"
        assert_one_line_error(task_args(address, hosts(1), "ps", 0), "is not free")


@pytest.mark.timeout(60)
def test_unknown_job_name():
    assert_one_line_error(task_args(*ps_and_worker_hosts(1, 1), "master", 0), "unknown --job_name 'master'")


@pytest.mark.timeout(60)
def test_backup_workers_need_sync_and_fewer_than_workers():
    assert_one_line_error(task_args(*ps_and_worker_hosts(1, 2), "worker", 0, "--sync", "--replicas-to-aggregate", "3"),
                          "exceeds the 2 worker(s)")
    assert_one_line_error(task_args(*ps_and_worker_hosts(1, 2), "worker", 0, "--replicas-to-aggregate", "1"),
                          "needs --sync")


@pytest.mark.timeout(60)
def test_the_classic_is_sync_spelling_is_checked():
    assert_one_line_error(task_args(*ps_and_worker_hosts(1, 1), "ps", 0, "--is_sync=maybe"), "--is_sync")


@pytest.mark.timeout(60)
def test_launch_rejects_bad_counts():
    assert_one_line_error([*PS_BASELINE, "launch", "--num-workers", "0"], "--num-workers")


@pytest.mark.timeout(90)
def test_worker_gives_up_when_its_ps_never_comes_up():
    # The PS address is free and nobody starts a PS there: the worker must say so.
    cmd = task_args(*ps_and_worker_hosts(1, 1), "worker", 0, *TINY, "--steps", "5", "--startup-timeout", "3")
    assert_one_line_error(cmd, "did not come up within 3s", within=45)


def test_an_unresolvable_ps_host_is_named_not_just_late():
    worker = hosts(1)
    one_line_error([*PS_BASELINE, "--ps_hosts=no-such-host.invalid:2222", f"--worker_hosts={worker}",
                           "--job_name=worker", "--task_index=0", "--threads", "1"],
                          "cannot resolve host no-such-host.invalid", within=40, code=2)
