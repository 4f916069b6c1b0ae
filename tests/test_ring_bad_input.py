"""Bad input: one line naming the problem, a non-zero exit, within seconds;
and a dead rank ends the job instead of hanging."""
import os
import signal
import time

import psutil
import pytest

from datafiles import write_cifar10, write_mnist_idx
from helpers import ONE_THREAD, Tasks, assert_one_line_error, assert_said_once_by_the_job, horovodrun, run

pytestmark = pytest.mark.timeout(120)


def test_unknown_model():
    assert_one_line_error(["ringtrain", "--model", "vgg99"], "--model")


def test_batch_size_zero():
    assert_one_line_error(["ringtrain", "--batch-size", "0"], "--batch-size")


def test_missing_data_dir():
    assert_one_line_error(["ringtrain", "--data-dir", "/nonexistent/mnist"], "/nonexistent/mnist")


def test_data_that_names_nothing():
    assert_one_line_error(["ringtrain", "--data", "/nonexistent/train-*"],
                          "--data /nonexistent/train-* matches no file")


def test_truncated_idx(tmp_path):
    folder = write_mnist_idx(str(tmp_path), gz=True)
    path = os.path.join(folder, "train-images-idx3-ubyte.gz")
    with open(path, "rb") as f:
        head = f.read()[:200]
    with open(path, "wb") as f:
        f.write(head)
    assert_one_line_error(["ringtrain", "--data-dir", folder], "train-images-idx3-ubyte.gz")


def test_corrupt_cifar(tmp_path):
    folder = write_cifar10(str(tmp_path))
    with open(os.path.join(folder, "cifar-10-batches-py", "test_batch"), "wb") as f:
        f.write(os.urandom(512))
    assert_one_line_error(["ringtrain", "--model", "cifar_resnet", "--data-dir", folder],
                          "test_batch")


def test_a_corrupt_cifar_batch_whose_unpickling_error_has_two_lines_is_still_one_line(tmp_path):
    folder = write_cifar10(str(tmp_path))
    with open(os.path.join(folder, "cifar-10-batches-py", "test_batch"), "wb") as f:
        f.write(b"P0\n.")  # a persistent id: pickle's message for it holds a newline
    assert_one_line_error(["ringtrain", "--model", "cifar_resnet", "--data-dir", folder],
                          "persistent id instruction was encountered, but no persistent_load")


def test_missing_checkpoint():
    assert_one_line_error(["ringtrain", "--resume", "/nonexistent/ckpt-3"], "/nonexistent/ckpt-3")


def test_unreadable_checkpoint_is_reported_and_kept(tmp_path):
    prefix = tmp_path / "ckpt-1"
    (tmp_path / "ckpt-1.index").write_bytes(b"\x00garbage index")
    (tmp_path / "ckpt-1.data-00000-of-00001").write_bytes(b"garbage")
    cmd = ["ringtrain", "--model", "mnist_mlp", "--steps", "1", "--resume", str(prefix), *ONE_THREAD]
    done = run(cmd, timeout=60)
    assert done.returncode == 2 and done.seconds < 30 and "Traceback" not in done.stderr
    assert f"cannot restore checkpoint {prefix}" in done.stderr.strip().splitlines()[-1]
    assert (tmp_path / "ckpt-1.index").read_bytes() == b"\x00garbage index"


@pytest.mark.slow
def test_bad_input_on_two_ranks_fails_fast_without_hanging():
    done = run(horovodrun(2, "--data-dir", "/nonexistent/mnist"), timeout=60)
    assert done.returncode != 0 and done.seconds < 30
    assert "/nonexistent/mnist" in done.stderr + done.stdout


@pytest.mark.slow
def test_a_dead_rank_ends_the_job_within_seconds_and_is_named(tmp_path):
    cmd = horovodrun(2, "--model", "mnist_cnn", "--steps", "100000", "--log-every", "5", *ONE_THREAD)
    with Tasks(str(tmp_path)) as tasks:
        launcher = tasks.start("job", cmd)
        tasks.wait_for_text("job", "step 5/", timeout=90)  # both ranks are training
        # the ranks: `python .../bin/ringtrain ...` below the launcher (mpirun names them in argv too)
        ranks = [p for p in psutil.Process(launcher.pid).children(recursive=True)
                 if p.cmdline()[1:2] and p.cmdline()[1].endswith("bin/ringtrain")]
        assert len(ranks) == 2, [p.cmdline()[:2] for p in ranks]
        os.kill(ranks[-1].pid, signal.SIGKILL)
        killed = time.monotonic()
        assert tasks.wait("job", 60) != 0
        assert time.monotonic() - killed < 20
        assert "exited on signal 9" in tasks.log("job")  # mpirun names the rank, its PID and host


@pytest.mark.slow
@pytest.mark.parametrize("gloo", [False, True], ids=["mpirun", "horovodrun-gloo"])
def test_a_bad_dataset_on_two_ranks_is_said_once_not_once_per_rank(gloo):
    from helpers import mpirun
    cmd = horovodrun(2, "--data-dir", "/nonexistent/mnist", gloo=True) if gloo else \
        mpirun(2, "--data-dir", "/nonexistent/mnist")
    assert_said_once_by_the_job(run(cmd, timeout=60), "/nonexistent/mnist")


def test_a_batch_larger_than_the_dataset_is_refused():
    assert_one_line_error(["ringtrain", "--batch-size", "4001"], "larger than the 4000 training samples")


@pytest.mark.slow
def test_openmpis_data_path_under_horovodrun_gloo_is_refused_once():
    # horovodrun --gloo starts no MPI: Horovod would crash on its first collective
    done = run(horovodrun(2, "--cpu-operations", "mpi", gloo=True), timeout=60)
    assert_said_once_by_the_job(done, "--cpu-operations mpi needs MPI")
    assert "Traceback" not in done.stdout + done.stderr
