"""The launcher commands the bench runs (argument lists only), and running
them through multihost.procs: one process group per run, and every process
of that group, and below it, ended by PID afterwards."""
import os
import shutil
import sys

from ringtrain.multihost import procs
from ringtrain.common.errors import UsageError

# The checkout: ringtrain/ and ps_baseline/ import from it as they are, and bench/ holds what a
# user of the bench reads (its columns) and its results.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def mpirun(np_, command, cores, env_names=(), hosts=None):
    """mpirun for np_ ranks: on this machine (--oversubscribe when ranks
    outnumber cores), or on `hosts` ('h1:1,h2:1'). Processes are not bound to
    cores, as horovodrun does it; PATH goes with them, as on a cluster."""
    cmd = [tool("mpirun"), "-np", str(np_), "--bind-to", "none"]
    if hosts:
        cmd += ["-H", hosts]
    elif np_ > cores:
        cmd.append("--oversubscribe")
    for name in ["PATH", *env_names]:
        cmd += ["-x", name]
    return cmd + list(command)


def horovodrun(np_, command, gloo=False, hosts=None):
    cmd = [tool("horovodrun"), "-np", str(np_), "-H", hosts or f"localhost:{np_}"]
    if gloo:
        cmd.append("--gloo")
    return cmd + list(command)


def run(cmd, log_path, timeout, env=None, host=None):
    """Run cmd (a list) in its own process group, on `host` if given, output
    to log_path. Returns the exit status; a timeout ends the whole tree and
    raises RuntimeError. Whatever the launcher left behind is ended too."""
    done = procs.run(cmd, timeout=timeout, host=host, cwd=REPO, env=child_env(env), log_path=log_path)
    if done.timed_out:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... timed out after {timeout:.0f} s (log: {log_path})")
    return done.returncode


def tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""
