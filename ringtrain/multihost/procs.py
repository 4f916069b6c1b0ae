"""Starting, watching and ending process trees, on this host or over ssh.

Every command is an argument list. A command for another host runs there
under multihost.guard, and the ssh command line that starts it is that
argument list quoted word by word (shlex.join): nothing from a hostfile or a
flag becomes shell syntax, here or there. The remote tree ends when its ssh
connection closes, so stopping (or losing) the launcher ends it too.

Locally, each command gets a session (process group) of its own and the
parent-death signal, and is ended by group and by each descendant's PID:
never by name.
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ringtrain.multihost.net import free_ports, is_local_host
from ringtrain.common.errors import UsageError

STOP_GRACE_SEC = 5.0  # SIGTERM, then SIGKILL after this long
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
               # a frozen or unplugged host ends the connection (and the job) in ~15 s
               "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$|^\[?[0-9A-Fa-f:.]+\]?$")


def check_host_name(host):
    """A host name or address, nothing that ssh or a shell could read as more."""
    if not HOST_NAME.match(host or ""):
        raise ValueError(f"{host!r} is not a host name or address")
    return host


def ssh_argv(host, argv, cwd=None, env=None):
    """The ssh command that runs `argv` on `host` under multihost.guard, in
    `cwd`, with `env` added. The hosts must share this Python's install path
    (a shared home or the same image), as mpirun and horovodrun also expect."""
    inner = [sys.executable, "-m", "ringtrain.multihost.guard"]
    if cwd:
        inner += ["--cwd", cwd]
    for name, value in (env or {}).items():
        inner += ["--env", f"{name}={value}"]
    return ["ssh", *SSH_OPTIONS, "--", check_host_name(host), shlex.join([*inner, "--", *argv])]


def dies_with_parent(sig=signal.SIGTERM):
    """A preexec_fn: the child gets `sig` when the process that started it dies."""
    def preexec():
        try:
            import ctypes
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    return preexec


class Process:
    """One command on one host. Output goes to `on_line(process, line)` (stdout
    and stderr merged), to the file `log_path`, or is captured (`capture`:
    .stdout and .stderr after wait()); otherwise it is inherited."""

    def __init__(self, argv, name=None, host=None, cwd=None, env=None, on_line=None,
                 log_path=None, capture=False):
        assert isinstance(argv, (list, tuple)), "commands are argument lists, never shell strings"
        self.name, self.host = name or os.path.basename(argv[0]), host
        self.remote = host is not None and not is_local_host(host)
        cmd = ssh_argv(host, list(argv), cwd or os.getcwd(), env) if self.remote else list(argv)
        self._log = open(log_path, "w") if log_path else None
        if self._log:
            self._log.write("$ " + shlex.join(cmd) + "\n")
            self._log.flush()
        piped = on_line is not None or capture
        self.popen = subprocess.Popen(
            cmd, cwd=None if self.remote else cwd, env=dict(os.environ, **(env or {})),
            # over ssh, stdin is the connection the remote guard watches: it stays open until stop()
            stdin=subprocess.PIPE if self.remote else subprocess.DEVNULL,
            stdout=subprocess.PIPE if piped else self._log,
            stderr=subprocess.STDOUT if on_line is not None or self._log else
            subprocess.PIPE if capture else None,
            text=True, errors="replace", start_new_session=True, preexec_fn=dies_with_parent())
        self.stdout, self.stderr, self._readers = [], [], []
        if on_line is not None:
            self._read(self.popen.stdout, lambda line: on_line(self, line))
        elif capture:
            self._read(self.popen.stdout, self.stdout.append)
            self._read(self.popen.stderr, self.stderr.append)

    def _read(self, stream, sink):
        def pump():
            for line in stream:
                sink(line)
        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        self._readers.append(thread)

    @property
    def pid(self):
        return self.popen.pid

    @property
    def returncode(self):
        return self.popen.returncode

    def poll(self):
        return self.popen.poll()

    def wait(self, timeout=None):
        """The exit status; subprocess.TimeoutExpired after `timeout` seconds."""
        code = self.popen.wait(timeout)
        for thread in self._readers:
            thread.join(timeout=5)
        return code

    def describe_exit(self):
        code = self.popen.returncode
        if code is None:
            return "is still running"
        if code < 0:
            return f"was killed by {_signal_name(-code)}"
        if self.remote and code == 255:
            return f"lost its ssh connection to {self.host} (host down or unreachable?)"
        if self.remote and code > 128:
            return f"was killed by {_signal_name(code - 128)}"
        return f"exited with status {code}"

    def send_signal(self, sig):
        """Pass `sig` on to the task's process group: locally, or over ssh
        through the remote guard (ssh itself carries no signals)."""
        if self.popen.poll() is not None:
            return
        if self.remote:
            try:
                self.popen.stdin.write(f"signal {int(sig)}\n")
                self.popen.stdin.flush()
            except (OSError, ValueError):  # (the connection is gone: the guard ends the task)
                pass
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def begin_stop(self):
        """Ask the tree to end: close the ssh connection, or SIGTERM locally."""
        self._tree = [self.popen.pid] + _descendants(self.popen.pid)
        if self.remote and self.popen.stdin and not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()  # the remote guard ends its tree, then ssh exits
            except OSError:
                pass
        else:
            terminate_tree(self.popen.pid, self._tree)

    def finish_stop(self, deadline):
        """After begin_stop(): SIGKILL whatever is left at `deadline`, reap it."""
        tree = getattr(self, "_tree", None) or [self.popen.pid]
        while time.monotonic() < deadline and _any_alive(self.popen, tree):
            time.sleep(0.1)
        if _any_alive(self.popen, tree):
            _signal_tree(self.popen.pid, tree, signal.SIGKILL)
        self.popen.wait()
        for thread in self._readers:
            thread.join(timeout=5)
        if self._log:
            self._log.close()

    def stop(self, grace=STOP_GRACE_SEC):
        stop_all([self], grace)


def stop_all(processes, grace=STOP_GRACE_SEC):
    """End every process tree: ask all at once, then SIGKILL what is left
    after `grace` seconds (remote guards get `grace` too, then 3 s more)."""
    for p in processes:
        p.begin_stop()
    deadline = time.monotonic() + grace + (3 if any(p.remote for p in processes) else 0)
    for p in processes:
        p.finish_stop(deadline)


def wait_all(processes, timeout):
    """Wait until every process has exited, or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.2)


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool


def run(argv, timeout=None, host=None, cwd=None, env=None, log_path=None):
    """Run `argv` to the end (on `host` over ssh, if it is another host) and
    end whatever it left behind. stdout and stderr are captured, or go to
    `log_path`. A timeout ends the whole tree; Finished.timed_out says so."""
    start = time.monotonic()
    process = Process(argv, host=host, cwd=cwd, env=env, log_path=log_path, capture=log_path is None)
    timed_out = False
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        process.stop()
    return Finished(process.returncode, "".join(process.stdout), "".join(process.stderr),
                    time.monotonic() - start, timed_out)


def free_ports_on(host, count):
    """`count` free ports on `host`: asked of the host itself, over ssh for another one."""
    if not host or is_local_host(host):
        return free_ports(count)
    done = run([sys.executable, "-m", "ringtrain.multihost.net", "free-ports", str(count)], host=host, timeout=60)
    if done.returncode != 0 or done.timed_out:
        reason = (done.stderr.strip().splitlines() or ["timed out"])[-1]
        raise UsageError(f"cannot start tasks on {host}: {reason}; check that `ssh {host} true` "
                         "works without a password and that hosts share this install path")
    return [int(port) for port in done.stdout.split()]


def _signal_name(number):
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def _descendants(pid):
    try:
        import psutil
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # gone already, or psutil missing: the group kill still applies
        return []


def _signal_tree(pgid, pids, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids[1:]:  # descendants that left the group
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate_tree(pgid, pids=()):
    """SIGTERM, then SIGCONT (as systemd does), to the group and to `pids[1:]`, as
    _signal_tree: a stopped process (a task frozen by SIGSTOP) acts on its SIGTERM at once
    instead of sitting out the grace period."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        _signal_tree(pgid, pids, sig)


def _any_alive(popen, pids):
    return popen.poll() is None or any(is_alive(pid) for pid in pids[1:])


def is_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead for our purposes
    except (OSError, IndexError):
        return False
