"""A private network namespace that has only loopback, for `ps-baseline
launch` on one machine.

TF's gRPC server binds every interface (it takes no bind address) and runs
any graph sent to it, without credentials. A cluster of tasks that all live
on this machine needs loopback only, so the launcher starts them inside a
namespace of their own: nothing outside it, on this machine or elsewhere, can
reach their ports. That needs root (`ip netns add`); otherwise the launcher
says so and why. Namespaces are named PREFIX-PID; one whose launcher is gone
(kill -9) is removed by the next launcher.
"""
import os
import shutil
import subprocess

PREFIX = "rtpriv"


class PrivateNetwork:
    """with PrivateNetwork() as net: net.wrap(argv) runs argv inside it; if
    it could not be made, net.name is None and net.why_not says why."""

    def __init__(self):
        self.name, self.why_not = None, None

    def __enter__(self):
        if os.geteuid() != 0:
            self.why_not = "not root, so no private network namespace"
        elif not shutil.which("ip"):
            self.why_not = "no `ip` command (iproute2), so no private network namespace"
        else:
            remove_stale()
            name = f"{PREFIX}-{os.getpid()}"
            made = _ip("netns", "add", name)
            if made.returncode == 0 and _ip("-n", name, "link", "set", "lo", "up").returncode == 0:
                self.name = name
            else:
                _ip("netns", "delete", name)
                self.why_not = f"`ip netns add` failed ({(made.stderr or '').strip() or 'no reason given'})"
        return self

    def wrap(self, argv):
        return ["ip", "netns", "exec", self.name, *argv] if self.name else list(argv)

    def __exit__(self, *exc):
        if self.name:
            _ip("netns", "delete", self.name)
        return False


def available():
    """(True, None), or (False, why): what `ringtrain doctor` reports."""
    with PrivateNetwork() as net:
        return net.name is not None, net.why_not


def remove_stale():
    """Delete our namespaces whose launcher no longer runs."""
    listed = _ip("netns", "list")
    for line in (listed.stdout or "").splitlines():
        name = line.split()[0] if line.split() else ""
        pid = name[len(PREFIX) + 1:]
        if name.startswith(PREFIX + "-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _ip("netns", "delete", name)


def _ip(*words):
    return subprocess.run(["ip", *words], capture_output=True, text=True, timeout=30)
