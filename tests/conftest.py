"""Shared test helpers: run real launchers in their own process group, kill
that group afterwards, pick free ports, and read the JSON summary."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)  # the venv's bin: ringtrain, horovodrun, mpirun wrappers

# OpenMPI refuses root without these; 1 TF thread per worker on 2 cores.
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           PATH=BIN + os.pathsep + os.environ.get("PATH", ""), PYTHONUNBUFFERED="1",
           TF_CPP_MIN_LOG_LEVEL="2")
ONE_THREAD = ["--threads", "1"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc):
    """Kill the process group a test started; never anything else."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run(cmd, timeout=300, cwd=REPO, env=None):
    """Run cmd (an argument list) in a new process group; return
    (returncode, stdout, stderr, seconds). The group is killed on the way out."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        kill_group(proc)
    return proc.returncode, out, err, time.monotonic() - start


def run_ok(cmd, timeout=300, **kw):
    code, out, err, _ = run(cmd, timeout, **kw)
    assert code == 0, f"exit {code}: {' '.join(cmd)}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
    return out


def last_json(text):
    """The final JSON summary: the last stdout line that parses as an object
    (launchers may prefix it with a rank tag such as `[1,0]<stdout>:`)."""
    for line in reversed(text.splitlines()):
        found = json_in(line)
        if found is not None:
            return found
    raise AssertionError(f"no JSON summary in output:\n{text[-3000:]}")


def json_in(line):
    """The JSON object in a line, ignoring a launcher's tags before or after it."""
    start = line.find("{")
    if start < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(line[start:])[0]
    except json.JSONDecodeError:
        return None


def horovodrun(np_, *args, gloo=False):
    return [os.path.join(BIN, "horovodrun"), "-np", str(np_)] + (["--gloo"] if gloo else []) \
        + [os.path.join(BIN, "ringtrain"), *args]


def mpirun(np_, *args, hostfile=None):
    where = ["--hostfile", hostfile] if hostfile else ["-np", str(np_)]
    return ["mpirun", *where, "-x", "PATH", "-x", "PYTHONUNBUFFERED",
            os.path.join(BIN, "ringtrain"), *args]
