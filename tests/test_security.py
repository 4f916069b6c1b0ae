"""No open door: `ps-baseline launch` on one machine keeps its unauthenticated
TF gRPC servers in a private network namespace with loopback only, says so in
one line (or warns, naming why not), and removes the namespace afterwards.
Checked from the bind addresses (`ss`); nothing is sent anywhere."""
import os
import re
import signal
import subprocess

import pytest

from helpers import ONE_THREAD, PS_BASELINE, Tasks, at_own_step
from ringtrain.multihost.private_net import PREFIX, PrivateNetwork
from ps_baseline.launcher import exposure


def listening_ports(netns=None):
    cmd = (["ip", "netns", "exec", netns] if netns else []) + ["ss", "-ltnH"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()}


def netns_names():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(os.geteuid() != 0, reason="a private network namespace needs root")
def test_launch_keeps_its_grpc_servers_off_every_interface_but_a_private_loopback(tmp_path):
    with Tasks(str(tmp_path)) as tasks:
        launch = tasks.start("launch", [*PS_BASELINE, "launch", "--num-ps", "1", "--num-workers", "2", "--sync",
                                        "--model", "mnist_mlp", "--steps", "100000", "--log-every", "20",
                                        *ONE_THREAD])
        tasks.wait_for_text("launch", at_own_step(0, 20), 150)
        log = tasks.log("launch")
        ports = {int(p) for p in re.findall(r"(?:ps|worker)\d+ at localhost:(\d+)", log)}
        name = re.search(r"private network namespace \((\S+)\) that has only loopback", log).group(1)
        assert len(ports) == 3 and name.startswith(PREFIX + "-"), log
        # inside: the servers listen; the namespace has loopback and nothing else
        assert ports <= listening_ports(name)
        links = subprocess.run(["ip", "-n", name, "-o", "link"], capture_output=True, text=True).stdout
        assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"], links
        # outside, on this machine's own interfaces, nothing listens on those ports
        assert not ports & listening_ports()
        launch.popen.send_signal(signal.SIGTERM)  # (the launcher alone: it stops its tasks, then its namespace)
        tasks.wait("launch", 120)
    assert name not in netns_names()  # removed with the launcher


@pytest.mark.skipif(os.geteuid() != 0, reason="a private network namespace needs root")
def test_a_namespace_left_by_a_killed_launcher_is_removed_by_the_next():
    stale = f"{PREFIX}-{2 ** 22 + 7}"  # above pid_max's default: no such process
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        with PrivateNetwork() as net:
            assert net.name and stale not in netns_names()
        assert net.name not in netns_names()
    finally:
        subprocess.run(["ip", "netns", "delete", stale], capture_output=True)


def test_without_a_private_namespace_launch_warns_in_one_line_naming_why():
    class NoNamespace:
        name, why_not = None, "not root, so no private network namespace"
    line = exposure(NoNamespace(), across_hosts=None)
    assert "\n" not in line and line.startswith("warning:")
    assert "not root" in line and "without authentication" in line and "every interface" in line
    assert "every interface of their hosts" in exposure(NoNamespace(), across_hosts="hosts")
