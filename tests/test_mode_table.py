"""The README's mode-by-feature table, walked cell by cell: each mode, with
two workers on this machine, runs each cross-cutting feature as its cell
says. The table is read from the README, so the README cannot drift from
what runs: every cell is read, the command column and the qualifiers too
(GPU pinning's "local rank", "per host", "one per tower"), and each row's
mode is found in the one registry of modes (ringtrain/modes.py).

A few runs per mode serve all its cells, every one reading the embedded MNIST
digits from TFRecord files (--data) in updates of 2 micro-batches
(--accumulate 2): one that checkpoints with a straggler, snapshots and a
diverging lr under --on-nan skip, in float16 with its loss scale (--precision)
(on a terminal, for the progress bar); a resume from it after its newest
checkpoint was cut short, still diverging, under --on-nan stop; a run on a
full disk; and one with a frozen worker. (That a resumed run goes on to its last step is
tests/test_ring_checkpoints.py's and tests/test_ps_training.py's.) A run that TF2 PS's
rare refused fetch ended (DEVELOPERS.md 7) is launched once more, from where it began."""
import functools
import math
import os
import pathlib
import re
import shutil
import signal
import time
from types import SimpleNamespace

import pytest

from helpers import (BIN, ENV, ONE_THREAD, REPO, Tasks, generated_code, last_json, once_more_after_tf_fetch_flake,
                     own_tmpfs, run, run_in_terminal)
from ringtrain import modes
from ringtrain.workloads.devices import ASSUMED_GPUS_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
README = pathlib.Path(REPO) / "README.md"
SMALL = ["--model", "mnist_mlp", "--batch-size", "16", "--optimizer", "sgd", "--lr", "0.05", *ONE_THREAD]
DIVERGING = ["--lr", "1e6"]
STALL = 6  # --stall-timeout of the frozen-worker runs
EXIT_PREEMPTED = 75  # stopped early by a scheduler's signal, resumable
MARGIN = 20  # a frozen worker ends the job within --stall-timeout plus this
RESUMED_STEPS = 30  # the resumed run's --steps: it diverges well before
HALF = ["--precision", "mixed_float16"]  # the first run and its resume


def read_table():
    """{mode: {feature: cell}}, the features in the README's order, and {mode: its command cell}."""
    text = README.read_text()
    lines = text[text.index("## What every mode does"):].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = lines[first:next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table]
    header = [h.strip("`") for h in rows[0]]
    assert header[:2] == ["mode", "command"], header
    return ({row[0]: dict(zip(header[2:], row[2:])) for row in rows[2:]}, header[2:],
            {row[0]: row[1] for row in rows[2:]})


TABLE, FEATURES, COMMANDS = read_table()


DISCOVER = os.path.join(REPO, "mpi_hostfiles", "discover_hosts.sh")


def command(mode, tmp):
    """How a user starts `mode` with two workers on this machine: the
    registered mode's launcher, with the words that select it."""
    registered, ringtrain = modes.by_row(mode), os.path.join(BIN, "ringtrain")
    words = list(registered.words)
    if registered.launcher == "mpirun":
        return ["mpirun", "-np", "2", "-x", "PATH", "-x", "PYTHONUNBUFFERED", ringtrain, *words]
    if registered.launcher == "horovodrun-elastic":
        hosts = tmp / "elastic-hosts"
        hosts.write_text("localhost:2\n")
        return ["env", f"RINGTRAIN_ELASTIC_HOSTS={hosts}", os.path.join(BIN, "horovodrun"), "--gloo", "-np", "2",
                "--min-np", "2", "--max-np", "2", "--host-discovery-script", DISCOVER, ringtrain, *words,
                "--commit-every", "2"]
    ps_baseline = os.path.join(BIN, "ps-baseline")
    if registered.launcher == "ps-baseline launch":
        return [ps_baseline, "launch", "--num-ps", "1", "--num-workers", "2", *words]
    assert registered.launcher == "ps-baseline towers", registered.launcher
    return [ps_baseline, "towers", "--towers", "2", *words]


def expected_steps(mode, steps):
    """The summary's steps for --steps S: updates, which in async modes are every worker's own steps."""
    return steps if modes.by_row(mode).sync else 2 * steps


def goes_on_without_a_worker(mode):
    """Async between-graph PS: each worker's gradients are an update of their own."""
    registered = modes.by_row(mode)
    return not registered.sync and registered.launcher == "ps-baseline launch" and not registered.one_process


# --- the runs each mode's cells share ------------------------------------------------------

class Runs:
    def __init__(self, mode, folder, records):
        self.mode, self.folder, self.records = mode, folder, records
        folder.mkdir(parents=True, exist_ok=True)

    def argv(self, *flags):
        return [*command(self.mode, self.folder), *SMALL, "--data", self.records, "--accumulate", "2", *flags]

    @functools.cached_property
    def first(self):
        """8 steps, checkpoints every 4, worker 1 at 3x, snapshots every 4, and a
        diverging lr skipped (--on-nan skip), on a terminal, with two GPUs assumed."""
        self.checkpoints, self.snapshots = self.folder / "ckpt", self.folder / "snapshots"
        self.summary_path, self.tmp = self.folder / "summary.json", self.folder / "tmp"
        # (two GPUs assumed by name: each process reports the one it asks for; bytecode written, as
        # where PYTHONDONTWRITEBYTECODE is unset, for the no-generated-code check)
        argv = self.argv(*DIVERGING, *HALF, "--on-nan", "skip", "--steps", "8", "--log-every", "2",
                         "--checkpoint-dir", str(self.checkpoints), "--checkpoint-every", "4",
                         "--straggler", "1:3", "--snapshot-every", "4", "--snapshot-dir", str(self.snapshots),
                         "--summary-json", str(self.summary_path))
        env = dict(ENV, **{ASSUMED_GPUS_ENV: "2", "TMPDIR": str(self.tmp), "PYTHONDONTWRITEBYTECODE": ""})

        def afresh():
            for folder in (self.checkpoints, self.snapshots, self.tmp):
                shutil.rmtree(folder, ignore_errors=True)
            self.summary_path.unlink(missing_ok=True)
            self.tmp.mkdir()
        self.tmp.mkdir()  # (a second call, after a failed run, fails here)
        done = once_more_after_tf_fetch_flake(lambda: run_in_terminal(argv, timeout=180, env=env), afresh)
        assert done.returncode == 0, done.output[-4000:]
        return done

    @functools.cached_property
    def summary(self):
        self.first
        return last_json(self.summary_path.read_text())

    @functools.cached_property
    def resumed(self):
        """--resume after the newest checkpoint of the first run was cut short, with
        the lr still diverging and --on-nan stop: it resumes, then stops on purpose."""
        import tensorflow as tf
        self.first
        newest = tf.train.latest_checkpoint(str(self.checkpoints))
        data = next(pathlib.Path(self.checkpoints).glob(os.path.basename(newest) + ".data-*"))
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # as a crash mid-write would
        before = self.folder / "ckpt-before-resume"
        shutil.copytree(self.checkpoints, before)

        def as_before():
            shutil.rmtree(self.checkpoints)
            shutil.copytree(before, self.checkpoints)
        argv = self.argv(*DIVERGING, *HALF, "--steps", str(RESUMED_STEPS), "--log-every", "100", "--checkpoint-dir",
                         str(self.checkpoints), "--resume", "--on-nan", "stop")
        return newest, once_more_after_tf_fetch_flake(lambda: run(argv, timeout=180), as_before)


RUNS = {}


@pytest.fixture
def runs(mode, tmp_path_factory, mnist_records):
    if mode not in RUNS:
        RUNS[mode] = Runs(mode, tmp_path_factory.mktemp(re.sub(r"\W+", "-", mode)), mnist_records)
    return RUNS[mode]


def error_lines(text):
    """The trainers' error lines (not the launcher's own status line after them: horovodrun
    says which process ended first, as mpirun's banner does)."""
    return [line for line in text.splitlines() if ": error:" in line and not line.startswith("horovodrun: error:")]


# --- each feature's check -------------------------------------------------------------------

def check_resume(runs, cell):
    _, done = runs.resumed
    start = int(re.search(r"steps (\d+)\.\.", done.stdout).group(1))
    assert 0 < start < expected_steps(runs.mode, RESUMED_STEPS), done.stdout[-3000:]


def check_checkpoint_fallback(runs, cell):
    newest, done = runs.resumed
    said = done.stdout + done.stderr
    assert f"warning: checkpoint {newest} is unreadable (" in said and ", the newest that reads" in said, said[-3000:]


def check_full_disk(runs, cell, small_disk):
    ckpt = small_disk / "ckpt"
    argv = runs.argv("--steps", "12", "--checkpoint-every", "4", "--checkpoint-dir", str(ckpt))
    done = once_more_after_tf_fetch_flake(lambda: run(argv, timeout=180),
                                          lambda: shutil.rmtree(ckpt, ignore_errors=True))
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    said = [line for line in error_lines(done.stdout + done.stderr) if "cannot write the checkpoint of step" in line]
    assert len(said) == 1 and "no space left on device; the last good checkpoint is" in said[0], said
    assert "Traceback" not in done.stdout + done.stderr
    assert not [name for name in os.listdir(ckpt) if "temp" in name]
    # the older checkpoint it names is kept, whole
    import tensorflow as tf
    good = re.search(r"the last good checkpoint is (\S+): ", said[0]).group(1)
    assert tf.train.load_checkpoint(good).get_variable_to_shape_map(), good


def check_on_nan_stop(runs, cell):
    _, done = runs.resumed
    said = done.stdout + done.stderr
    assert done.returncode == 3 and "Traceback" not in said, said[-3000:]
    lines = [line for line in error_lines(said) if "non-finite loss at step" in line]
    assert lines and all("training stopped before applying it" in line and "--on-nan skip" in line
                         for line in lines), said[-3000:]


def check_on_nan_skip(runs, cell):
    assert runs.summary["skipped_steps"] > 0, runs.summary
    assert "update skipped (--on-nan skip)" in runs.first.output


def check_stall_timeout(runs, cell):
    frozen = frozen_worker(runs)
    assert frozen.seconds < STALL + MARGIN, frozen.output[-3000:]
    if goes_on_without_a_worker(runs.mode):
        assert frozen.code == 0 and "training goes on without it" in frozen.output, frozen.output[-3000:]
        assert '"reporting_workers": [0]' in frozen.output
        return
    lines = error_lines(frozen.output)
    assert frozen.code != 0 and len(lines) == 1 and "Traceback" not in frozen.output, frozen.output[-3000:]
    assert re.search(frozen.named, lines[0]), (frozen.named, lines)


def check_preemption(runs, cell):
    """SIGTERM to one worker process (ring rank 1, PS worker task 1, the towers' one
    process) once training is under way: every process stops after one step they
    agree on, the chief writes a checkpoint there and says so in one line, and the
    job exits 75 (stopped early, resumable)."""
    import tensorflow as tf
    folder = runs.folder / "preempted"
    name, mode = "preempted-" + re.sub(r"\W+", "-", runs.mode), runs.mode

    def preempted():
        with Tasks(str(runs.folder)) as tasks:
            job = tasks.start(name, runs.argv("--steps", "100000", "--log-every", "10", "--checkpoint-dir", str(folder)))
            under_way = others_training if goes_on_without_a_worker(mode) else re.compile(r"\bstep 20/")
            tasks.wait_for_text(name, under_way, 150)
            victim = psutil_process(job.pid) if modes.by_row(mode).launcher == "ps-baseline towers" else \
                worker_1(psutil_process(job.pid).children(recursive=True), mode)
            victim.send_signal(signal.SIGTERM)
            return SimpleNamespace(returncode=tasks.wait(name, 60), output=tasks.log(name))
    done = once_more_after_tf_fetch_flake(preempted, lambda: shutil.rmtree(folder, ignore_errors=True))
    code, log = done.returncode, done.output
    lines = [line for line in log.splitlines() if ": stopped by " in line]
    assert code == EXIT_PREEMPTED and len(lines) == 1 and "agreed by every" in lines[0], log[-3000:]
    if modes.by_row(mode).launcher != "ps-baseline towers":  # (the process that says it was not signalled)
        assert "by a signal to another process of the job" in lines[0], lines[0]
    step = int(re.search(r"after step (\d+)", lines[0]).group(1))
    saved = re.search(r"checkpoint (\S+) written", lines[0]).group(1)
    assert saved.endswith(f"-{step}") and tf.train.load_checkpoint(saved).get_variable_to_shape_map(), lines[0]


def others_training(log):
    """Async PS: past step 20, and a global step ahead of the logged worker's own steps,
    so another worker's updates are in. (Signalled before its loop starts, a worker has no
    step to agree on, and says so in a line of its own.)"""
    own_and_global = re.findall(r"\bstep (\d+)/\d+ global step (\d+)", log)
    return re.search(r"\bstep 20/", log) and any(int(g) > int(n) for n, g in own_and_global)


def psutil_process(pid):
    import psutil
    return psutil.Process(pid)


def check_straggler(runs, cell):
    waited = runs.summary["straggler"]["waited_sec"]
    assert len(waited) == 2 and waited[0] == 0 and waited[1] > 0, waited


def check_snapshot_every(runs, cell):
    from ringtrain.workloads import snapshots
    records = snapshots.read(str(runs.snapshots))
    assert [r["step"] for r in records][:2] == [4, 8] and all(r["samples_seen"] > 0 for r in records), records
    assert snapshots.load(str(runs.snapshots), records[0])


def check_gpu_pinning(runs, cell):
    """With two GPUs assumed, what each process asked for: rank (or worker, or
    tower) i on GPU i, as its qualifier says, so that a mode that pins every
    worker to one GPU fails here, on a machine without any."""
    qualifier = cell.removeprefix("✓").strip()
    assert qualifier == modes.by_row(runs.mode).pinning, (cell, modes.by_row(runs.mode).pinning)
    if qualifier == "one per tower":  # one process: its towers, each on a device of its own
        assert runs.summary["devices"] == ["/device:GPU:0", "/device:GPU:1"], runs.summary["devices"]
    else:  # "local rank", "per host": each worker process, by its place among those of its host
        assert qualifier in ("local rank", "per host"), cell
        assert runs.summary["worker_devices"] == ["GPU:0", "GPU:1"], runs.summary["worker_devices"]


SHARED_FIELDS = {"mode", "model", "world_size", "steps", "images_per_sec", "images_per_sec_per_worker",
                 "step_time_p50_sec", "test_accuracy", "train_loss", "hosts", "worker_devices", "checkpoint",
                 "skipped_steps", "straggler", "wall_time_sec", "config"}


def check_summary_json(runs, cell):
    assert SHARED_FIELDS <= set(runs.summary), SHARED_FIELDS - set(runs.summary)
    assert runs.summary["world_size"] == 2 and runs.summary["steps"] == expected_steps(runs.mode, 8)


def check_progress(runs, cell):
    output = runs.first.output.replace("\r\n", "\n")  # (a terminal ends lines with \r\n)
    assert cell.split()[0] == modes.by_row(runs.mode).progress, cell
    if cell == "bar":
        assert re.search(r"\r.*\[#+\.*\] ", output), output[-2000:]
    else:
        assert cell == "lines ¹" and re.search(r"step 4/8", output) and "\r[" not in output, output[-2000:]


def check_data(runs, cell):
    """The TFRecord files, each worker its own of the 4 (by file), and the test split beside them, read through
    the same pipeline."""
    said = f"on {runs.records} (4000 train, 1000 test; 10 classes; read at 28x28x1; sharded by file (4 files))"
    assert said in runs.first.output, runs.first.output[:3000]
    assert runs.summary["data_source"] == runs.records and runs.summary["test_samples"] == 1000


def check_precision(runs, cell):
    """float16 compute with the loss scale, which the mode keeps (and checkpoints) with its weights;
    on the GPUs assumed here, no note that float16 is slow on a CPU."""
    import tensorflow as tf
    assert runs.summary["precision"] == "mixed_float16" and "mixed_float16 (loss scaled)" in runs.first.output
    assert "float16 on a CPU" not in runs.first.output
    oldest = min(runs.checkpoints.glob("*.index"), key=lambda p: int(re.search(r"-(\d+)\.index$", p.name).group(1)))
    reader = tf.train.load_checkpoint(str(oldest)[:-len(".index")])
    scales = [float(reader.get_tensor(n)) for n in reader.get_variable_to_shape_map()
              if n.split("/")[0] == "loss_scale"]
    assert len(scales) == 1 and 1 <= scales[0] <= 2 ** 15 and scales[0] == 2 ** round(math.log2(scales[0])), scales


def check_accumulate(runs, cell):
    """Each update is 2 micro-batches of 16 per worker: the epoch has half the steps, and each step the samples."""
    registered, summary = modes.by_row(runs.mode), runs.summary
    assert "2 micro-batches of 16 per update" in runs.first.output and "63 steps/epoch" in runs.first.output
    drives = 2 if registered.one_process and registered.sync else 1  # (towers, in-graph: both workers each step)
    steps = sum(r["timed_steps"] for r in summary["network"])
    assert summary["accumulate"] == 2 and summary["timed_samples"] == steps * 2 * 16 * drives, summary


QUALIFIED = ("GPU pinning", "progress")  # cells with more than ✓: their checks read them
CHECKS = {"--resume": check_resume, "checkpoint fallback": check_checkpoint_fallback, "full disk": check_full_disk,
          "--on-nan stop": check_on_nan_stop, "--on-nan skip": check_on_nan_skip,
          "--stall-timeout": check_stall_timeout, "preemption": check_preemption, "--straggler": check_straggler,
          "--snapshot-every": check_snapshot_every, "GPU pinning": check_gpu_pinning,
          "--summary-json": check_summary_json, "progress": check_progress, "--data": check_data,
          "--precision": check_precision, "--accumulate": check_accumulate}


def test_the_table_names_every_mode_and_every_feature_once():
    assert set(FEATURES) == set(CHECKS) and len(FEATURES) == len(CHECKS)
    rows = [m.row for m in modes.MODES]
    assert sorted(TABLE) == sorted(rows) and len(rows) == len(set(rows))  # every registered mode, once


@pytest.mark.parametrize("mode", list(TABLE))
def test_each_rows_command_is_how_its_mode_is_started(mode, tmp_path):
    """The command column is the registry's, and the test runs it: its words, in
    order, with N = 2 (and the elastic run's discovery script)."""
    cell = COMMANDS[mode]
    assert cell == f"`{modes.by_row(mode).command}`", cell
    wanted = [{"N": "2", "S": DISCOVER}.get(w, w) for w in cell.strip("`").split()]
    argv = iter(os.path.basename(w) if w.startswith(BIN) else w for w in command(mode, tmp_path))
    assert all(word in argv for word in wanted), (wanted, command(mode, tmp_path))


@pytest.mark.parametrize("mode", list(TABLE))
def test_a_run_leaves_no_generated_code_in_the_temp_folder(mode, runs):
    """AutoGraph writes each function it converts to the temp folder, and deletes
    it at exit only if atexit hooks run: ranks end by os._exit (errors.exit_now).
    Its hook leaves the bytecode that Python cached beside it."""
    runs.first
    left = generated_code(runs.tmp)
    assert not left, [(p.name, p.read_bytes()[:300]) for p in left[:3]]


@pytest.mark.parametrize("mode,feature", [(m, f) for m in TABLE for f in FEATURES])
def test_every_cell_of_the_table(mode, feature, runs, request):
    cell = TABLE[mode][feature]
    if feature not in QUALIFIED:
        assert cell == "✓", f"{mode} / {feature}: a cell is ✓, or a qualifier this test reads: {cell!r}"
    check = CHECKS[feature]
    extra = {"small_disk": request.getfixturevalue("small_disk")} if feature == "full disk" else {}
    check(runs, cell, **extra)


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs of our own: one mnist_mlp checkpoint (SGD, 2.6 MB) fits, a second does not."""
    with own_tmpfs(tmp_path / "small", "ringtrain-test-small", "size=4m") as path:
        yield path


# --- a frozen worker ---------------------------------------------------------------------------

class Frozen:
    def __init__(self, code, output, seconds, named):
        self.code, self.output, self.seconds, self.named = code, output, seconds, named


def frozen_worker(runs):
    """Worker 1 frozen (SIGSTOP: alive, holding its sockets, doing nothing) once
    training is under way; towers, one process, stalls on a step that never ends.
    Returns how the job ended, and what the line that ends it must name."""
    import psutil
    mode, flags = runs.mode, ["--stall-timeout", str(STALL), "--log-every", "10"]
    one_process = modes.by_row(mode).launcher == "ps-baseline towers"  # (no worker of its own to freeze)
    named = ("the training step has not returned" if one_process else
             r"\brank \d" if modes.by_row(mode).launcher == "horovodrun-elastic" else r"\b(rank|worker|worker task) 1\b")
    if one_process:
        flags += ["--straggler", "1:100000"]  # tower 1's every step waits 100000 times its compute
    goes_on = goes_on_without_a_worker(mode)
    # (the survivor goes on for --stall-timeout and more after the freeze at step 20, at 60 ms a step or slower)
    steps = ["--steps", "200", "--simulate-gpu", "30"] if goes_on else ["--steps", "100000"]
    temp = runs.folder / "stall-tmp"  # (AutoGraph's files: the frozen worker is killed, and cannot remove its own)
    temp.mkdir()

    def once():
        with Tasks(str(runs.folder)) as tasks:
            name = "stall-" + re.sub(r"\W+", "-", mode)
            job = tasks.start(name, ["env", f"TMPDIR={temp}", *runs.argv(*flags, *steps)])
            if one_process:
                tasks.wait_for_text(name, "steps 0..", 120)
                started = time.monotonic()
                code = tasks.wait(name, STALL + MARGIN + 30)
                return Frozen(code, tasks.log(name), time.monotonic() - started - STALL, named)
            tasks.wait_for_text(name, "step 20/", 150)
            victim = worker_1(psutil.Process(job.pid).children(recursive=True), mode)
            victim.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            try:
                code = tasks.wait(name, STALL + MARGIN + (60 if goes_on else 0))
            finally:
                try:
                    victim.send_signal(signal.SIGCONT)
                except psutil.Error:
                    pass
            seconds = time.monotonic() - started if not goes_on else 0
            return Frozen(code, tasks.log(name), seconds, named)

    def afresh():
        shutil.rmtree(temp)
        temp.mkdir()
    return once_more_after_tf_fetch_flake(once, afresh)


def worker_1(processes, mode):
    """Rank 1 (mpirun's rank, or horovodrun's first assignment), or PS worker task 1."""
    def argv_env(p):
        try:
            return p.cmdline(), p.environ()
        except Exception:  # noqa: BLE001 -- gone, or not ours to read
            return [], {}
    launcher = modes.by_row(mode).launcher
    if launcher in ("mpirun", "horovodrun-elastic"):
        ranks = [p for p in processes if argv_env(p)[0][1:2] and argv_env(p)[0][1].endswith("bin/ringtrain")]
        rank = "OMPI_COMM_WORLD_RANK" if launcher == "mpirun" else "HOROVOD_RANK"
        return next(p for p in ranks if argv_env(p)[1].get(rank) == "1")
    return next(p for p in processes if "--job_name=worker" in argv_env(p)[0] and "--task_index=1" in argv_env(p)[0])
