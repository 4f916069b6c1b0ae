"""Starting the launchers: argument lists only, one process group per run,
and every process of that group, and below it, ended by PID afterwards."""
import os
import shutil
import signal
import subprocess
import sys
import time

from workloads.errors import UsageError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(extra=None):
    """Our environment plus: the venv first on PATH, the repo importable, and
    OpenMPI allowed to run as root (harmless otherwise)."""
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra or {})
    return env


def tool(name):
    """Absolute path of a launcher, preferring the one next to our Python."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    found = local if os.access(local, os.X_OK) else shutil.which(name)
    if not found:
        raise UsageError(f"{name} not found on PATH: run `make install` (or activate .venv)")
    return found


def mpirun(np_, command, cores, env_names=()):
    """mpirun for np_ local ranks; --oversubscribe when ranks outnumber cores.
    Processes are not bound to cores, as horovodrun does it."""
    cmd = [tool("mpirun"), "-np", str(np_), "--bind-to", "none"]
    if np_ > cores:
        cmd.append("--oversubscribe")
    for name in env_names:
        cmd += ["-x", name]
    return cmd + list(command)


def horovodrun(np_, command, gloo=False):
    cmd = [tool("horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}"]
    if gloo:
        cmd.append("--gloo")
    return cmd + list(command)


def _descendants(pid):
    try:
        import psutil
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


def end_tree(proc):
    """SIGTERM, then SIGKILL, to the process, its group and each descendant by PID."""
    pids = [proc.pid] + _descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is None or any(_alive(p) for p in pids[1:]):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            for pid in pids[1:]:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.time() + 5
            while time.time() < deadline and (proc.poll() is None or any(_alive(p) for p in pids[1:])):
                time.sleep(0.1)
    proc.poll()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def run(cmd, log_path, timeout, env=None):
    """Run cmd (a list) in its own session, output to log_path. Returns the
    exit status; a timeout ends the whole tree and raises RuntimeError."""
    assert isinstance(cmd, (list, tuple)), "commands are argument lists, never shell strings"
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(env),
                                start_new_session=True, cwd=REPO)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_tree(proc)
            raise RuntimeError(f"{' '.join(cmd[:4])} ... timed out after {timeout:.0f} s (log: {log_path})")
        except BaseException:
            end_tree(proc)
            raise
        end_tree(proc)  # stragglers a launcher left behind
        return rc


def tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""
