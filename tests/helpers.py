"""What the tests share: running real launchers in their own process group
(multihost.procs, which ends the whole tree afterwards), reading summaries,
weights and checkpoints, the one-line-error check, and PS tasks started one
process per task, as the classic distributed-TensorFlow tutorials do."""
import contextlib
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from ringtrain.multihost import procs
from ringtrain.multihost.net import free_ports

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "tests", "scripts")  # what the tests run on several ranks
BIN = os.path.dirname(sys.executable)  # the venv's bin: ringtrain, horovodrun, ps-baseline

# OpenMPI refuses root without these; 1 TF thread per worker on 2 cores.
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           PATH=BIN + os.pathsep + os.environ.get("PATH", ""), PYTHONUNBUFFERED="1",
           TF_CPP_MIN_LOG_LEVEL="2")
ONE_THREAD = ["--threads", "1"]


# --- running commands ---------------------------------------------------------

def run(cmd, timeout=300, cwd=REPO, env=None, host=None):
    """Run cmd (an argument list) to the end in a new process group, on `host`
    over ssh if given; returns procs.Finished. A timeout fails the test."""
    done = procs.run(cmd, timeout=timeout, cwd=cwd, env=env or ENV, host=host)
    if done.timed_out:
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def run_in_terminal(cmd, timeout=300, env=None):
    """Run cmd with a pseudo-terminal as its stdout and stderr, as a person at
    a terminal would, in a process group of its own that is ended afterwards.
    Returns .returncode and .output (both streams, as the terminal got them)."""
    import pty
    import select
    import signal
    import subprocess
    from types import SimpleNamespace
    master, terminal = pty.openpty()
    process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, cwd=REPO,
                               env=env or ENV, start_new_session=True)
    os.close(terminal)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    data = b""
                if not data:
                    break
                chunks.append(data)
        else:
            pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{b''.join(chunks).decode()[-3000:]}")
        process.wait(timeout=30)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        os.close(master)
    return SimpleNamespace(returncode=process.returncode, output=b"".join(chunks).decode(errors="replace"))


# TF2 PS's rare failure (DEVELOPERS.md 7): a worker's gRPC server refused the
# coordinator's copy of a finished step's result, and the chief exited 1.
TF_FETCH_FLAKE = "Unable to parse request"


def once_more_after_tf_fetch_flake(attempt, reset):
    """attempt()'s result (a run's: .output, or .stdout and .stderr), or, when what it
    said holds TF_FETCH_FLAKE, a second attempt's after reset() has put back what the
    first found. An AssertionError from attempt() counts as what it said. Nothing
    else is tried twice: TF retries no such fetch, and a rerun step would apply twice."""
    try:
        result = attempt()
    except AssertionError as failed:
        if TF_FETCH_FLAKE not in str(failed):
            raise
    else:
        said = result.output if hasattr(result, "output") else result.stdout + result.stderr
        if TF_FETCH_FLAKE not in said:
            return result
    reset()
    return attempt()


def run_ok(cmd, timeout=300, **kw):
    return ok(run(cmd, timeout, **kw), cmd)


def ok(done, cmd):
    """The stdout of `done` (run(cmd)'s), once its zero exit is asserted."""
    assert done.returncode == 0, (f"exit {done.returncode}: {' '.join(cmd)}\nstdout:\n{done.stdout[-4000:]}\n"
                                  f"stderr:\n{done.stderr[-4000:]}")
    return done.stdout


def run_bench(args, timeout):
    """`ringtrain-bench ARGS` to a zero exit; its stdout."""
    from ringtrain.bench.launch import child_env
    done = run(BENCH + args, timeout=timeout, env=child_env())
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return done.stdout


def assert_one_line_error(cmd, expected, within=10, code=None, **kw):
    """Bad input: a non-zero exit (`code` if given) within `within` seconds,
    and stderr is one line that contains `expected`; no traceback."""
    done = run(cmd, timeout=within + 50, **kw)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0, done.stdout
    if code is not None:
        assert done.returncode == code, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.seconds < within, f"took {done.seconds:.1f}s"
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and expected in lines[0], done.stderr
    return lines[0]


def assert_said_once_by_the_job(done, expected):
    """A job of ranks failed, and one line of all its ranks' output says why."""
    assert done.returncode != 0
    said = [line for line in (done.stdout + done.stderr).splitlines() if "ringtrain: error:" in line]
    assert len(said) == 1 and expected in said[0], done.stdout + done.stderr


def horovodrun(np_, *args, gloo=False, hosts=None):
    where = ["-H", hosts] if hosts else []
    return [os.path.join(BIN, "horovodrun"), "-np", str(np_), *where, *(["--gloo"] if gloo else []),
            os.path.join(BIN, "ringtrain"), *args]


def mpirun(np_, *args, hostfile=None):
    where = ["--hostfile", hostfile] if hostfile else ["-np", str(np_)]
    return ["mpirun", *where, "-x", "PATH", "-x", "PYTHONUNBUFFERED",
            os.path.join(BIN, "ringtrain"), *args]


def descendant(pid, match):
    """The one process below `pid` for which match(psutil.Process) holds."""
    import psutil
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if match(child):
                found.append(child)
        except psutil.Error:
            continue
    assert len(found) == 1, [c.cmdline() for c in found]
    return found[0]


def ps_task(job, index):
    """A match for descendant(): the PS-mode task `job` `index` (as `launch` starts it)."""
    return lambda p: f"--job_name={job}" in p.cmdline() and f"--task_index={index}" in p.cmdline()


# --- reading what runs leave ----------------------------------------------------

def last_json(text):
    """The final JSON summary: the last stdout line that parses as an object
    (launchers may prefix it with a rank tag such as `[1,0]<stdout>:`)."""
    for line in reversed(text.splitlines()):
        found = json_in(line)
        if found is not None:
            return found
    raise AssertionError(f"no JSON summary in output:\n{text[-3000:]}")


def json_objects(line):
    """Every JSON object in a line, in order, ignoring what is around them: two ranks'
    reports can share a line of mpirun's output (seen: `{...}{...}`)."""
    decoder, found, start = json.JSONDecoder(), [], line.find("{")
    while start >= 0:
        try:
            value, end = decoder.raw_decode(line, start)
            found.append(value)
            start = line.find("{", end)
        except json.JSONDecodeError:
            start = line.find("{", start + 1)
    return found


def on_two_ranks(script, *args, gloo=False, env=(), timeout=240):
    """mpirun -np 2 (or horovodrun --gloo -np 2) python tests/scripts/SCRIPT ARGS, with
    `env`'s (name, value) pairs on every rank: every JSON object it printed."""
    python = [os.path.join(BIN, "python"), os.path.join(SCRIPTS, script), *args]
    if gloo:
        cmd = [os.path.join(BIN, "horovodrun"), "--gloo", "-np", "2", *python]
    else:
        exports = [word for name, _ in env for word in ("-x", name)]
        cmd = ["mpirun", "-np", "2", "-x", "PATH", *exports, *python]
    out = run_ok(cmd, timeout=timeout, env=dict(ENV, **dict(env)))
    return [found for line in out.splitlines() for found in json_objects(line)]


def assert_every_check_ok(lines, checks):
    """Both ranks reported each of `checks` ({"rank", "check", "ok", "detail"} lines), all ok."""
    failed = [f"rank {r['rank']} {r['check']}: {r['detail']}" for r in lines if not r["ok"]]
    assert not failed, "\n".join(failed)
    for rank in (0, 1):
        assert {r["check"] for r in lines if r["rank"] == rank} == set(checks), (rank, lines)


def json_in(line):
    """The (first) JSON object in a line, ignoring a launcher's tags before or after it."""
    found = json_objects(line)
    return found[0] if found else None


def weights(path_pattern, rank):
    """A rank's --dump-weights arrays, in the model's variable order."""
    with np.load(path_pattern.format(rank=rank)) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def assert_same_weights(a, b, exact=False):
    """Two non-empty lists of arrays, pairwise equal (exactly, or to float tolerance)."""
    assert len(a) == len(b) > 0, f"{len(a)} against {len(b)} arrays"
    for x, y in zip(a, b):
        if exact:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def checkpoint_step(folder):
    """The step in the file name of a folder's newest TF checkpoint."""
    with open(os.path.join(folder, "checkpoint")) as f:
        return int(re.search(r'model_checkpoint_path: ".*-(\d+)"', f.read()).group(1))


def assert_checkpoint_is_one_process_on_the_global_batch(checkpoint_dir, steps, lr, batch, workers, accumulate=1):
    """Sync PS (K = W) with plain SGD on mnist_mlp, seed 0, no dropout: the
    chief's checkpoint equals one process stepping on the workers' batches
    taken together (the global batch), each worker's `accumulate` micro-batches
    of `batch` included."""
    import tensorflow as tf
    from ringtrain.workloads import data, models
    from ringtrain.workloads.data import as_float
    from ringtrain.workloads.sharding import epoch_shard

    dataset = data.load("mnist")
    reference = models.build("mnist_mlp", seed=0)
    shards = [epoch_shard(len(dataset.train_labels), r, workers, batch, 0, 0) for r in range(workers)]
    for step in range(steps):
        micro = range(step * accumulate, (step + 1) * accumulate)
        count = shards[0].global_counts[list(micro)].sum()
        # The global batch's loss, its gradient summed over pieces of `batch` samples as the
        # workers take them: the same sum (a ReLU whose input lies 1e-8 from 0 can decide
        # otherwise in a matmul of another shape, and moved a weight by 2e-5 after 4 steps).
        grads = [0.0] * len(reference.trainable_variables)
        for rows in [slice(m * batch, (m + 1) * batch) for m in micro]:
            for shard in shards:
                idx = shard.indices[rows]
                with tf.GradientTape() as tape:
                    losses = models.per_example_loss(reference(as_float(dataset.train_images[idx]), True),
                                                     dataset.train_labels[idx])
                    loss = tf.reduce_sum(shard.weights[rows] * losses) / count
                grads = [a + b for a, b in zip(grads, tape.gradient(loss, reference.trainable_variables))]
        for v, g in zip(reference.trainable_variables, grads):
            v.assign_sub(lr * g)

    checkpoint = tf.train.load_checkpoint(checkpoint_dir)
    assert checkpoint.get_tensor("global_step") == steps
    assert len(reference.trainable_variables) > 0
    for v in reference.trainable_variables:
        name = v.name.split(":")[0]  # "dense_1/kernel", as in the PS graph
        np.testing.assert_allclose(checkpoint.get_tensor(name), v.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


# --- PS tasks, one process each, as the classic tutorials start them --------------------------

PS_BASELINE = [sys.executable, "-m", "ps_baseline"]
BENCH = [sys.executable, "-m", "ringtrain.bench"]
TINY = ["--model", "mnist_mlp", "--batch-size", "16", "--log-every", "5", *ONE_THREAD]


def hosts(count, host="localhost"):
    return ",".join(f"{host}:{port}" for port in free_ports(count))


def ps_and_worker_hosts(ps=1, workers=1, host="localhost"):
    """--ps_hosts and --worker_hosts with ports drawn in one go: two separate
    hosts() calls may hand the same just-freed port to both jobs."""
    ports = [f"{host}:{port}" for port in free_ports(ps + workers)]
    return ",".join(ports[:ps]), ",".join(ports[ps:])


def at_own_step(worker, step):
    """A PS worker's progress line at its own step `step`: `step N/T` where
    training ends at this worker's steps (async), `global step G/T (this
    worker's step N)` where it ends at the job's updates (sync)."""
    return re.compile(rf"worker {worker}: epoch \d+ (step {step}/|global step \d+/\d+ \(this worker's step {step}\))")


def task_args(ps_hosts, worker_hosts, job, index, *extra):
    return [*PS_BASELINE, f"--ps_hosts={ps_hosts}", f"--worker_hosts={worker_hosts}",
            f"--job_name={job}", f"--task_index={index}", *extra]


class Tasks:
    """Started tasks, each logging to its own file; every tree ended on exit."""

    def __init__(self, folder):
        self.folder, self.procs = folder, {}

    def start(self, name, argv, host=None):
        self.procs[name] = procs.Process(argv, name=name, host=host, cwd=REPO, env=ENV,
                                         log_path=os.path.join(self.folder, f"{name}.log"))
        return self.procs[name]

    def log(self, name):
        with open(os.path.join(self.folder, f"{name}.log")) as f:
            return f.read()

    def wait(self, name, timeout):
        try:
            return self.procs[name].wait(timeout)
        except procs.subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {timeout}s:\n{self.log(name)[-3000:]}")

    def wait_for_text(self, name, text, timeout):
        """Until the task's log holds `text` (a string, a compiled pattern it must match,
        or a function of the log that says when)."""
        deadline = time.monotonic() + timeout
        found = text.search if hasattr(text, "search") else text if callable(text) else (lambda log: text in log)
        while not found(self.log(name)):
            assert self.procs[name].poll() is None, f"{name} exited:\n{self.log(name)[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} from {name}:\n{self.log(name)[-3000:]}"
            time.sleep(0.2)

    def kill(self, name):
        """SIGKILL the task's process group (locally) and reap it."""
        process = self.procs[name]
        os.killpg(process.pid, procs.signal.SIGKILL)
        return process.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        procs.stop_all(list(self.procs.values()))


def wait_until(condition, timeout, describe=lambda: ""):
    """Until condition() holds; past `timeout` seconds, fail with what describe() gives."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still not so after {timeout} s: {describe()}"
        time.sleep(0.3)


def generated_code(folder):
    """What AutoGraph generated in `folder` (a process's TMPDIR): its modules, and the
    bytecode Python cached beside them where PYTHONDONTWRITEBYTECODE is unset."""
    import pathlib
    folder = pathlib.Path(folder)
    return [path for where in (folder, folder / "__pycache__") if where.exists() for path in where.iterdir()
            if path.name.startswith("__autograph_generated_file")]


@contextlib.contextmanager
def own_tmpfs(path, name, options):
    """A tmpfs of our own at `path` (made), named `name`, unmounted after; skips unless root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, name, str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
