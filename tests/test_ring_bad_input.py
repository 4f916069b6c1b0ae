"""Bad input: one line naming the problem, a non-zero exit, within seconds."""
import os
import signal
import subprocess
import time

import pytest

from conftest import ENV, ONE_THREAD, REPO, horovodrun, kill_group, run
from datafiles import write_cifar10, write_mnist_idx

pytestmark = pytest.mark.timeout(120)


def assert_one_line_error(cmd, expected, max_seconds=10):
    code, out, err, seconds = run(cmd, timeout=60)
    lines = [l for l in err.splitlines() if l.strip()]
    assert code != 0, out
    assert seconds < max_seconds, f"took {seconds:.1f}s"
    assert "Traceback" not in err, err
    assert len(lines) == 1 and expected in lines[0], err


def test_unknown_model():
    assert_one_line_error(["ringtrain", "--model", "vgg99"], "--model")


def test_batch_size_zero():
    assert_one_line_error(["ringtrain", "--batch-size", "0"], "--batch-size")


def test_missing_data_dir():
    assert_one_line_error(["ringtrain", "--data-dir", "/nonexistent/mnist"], "/nonexistent/mnist")


def test_model_and_dataset_that_do_not_fit():
    assert_one_line_error(["ringtrain", "--model", "cifar_resnet", "--dataset", "mnist"],
                          "cifar_resnet takes")


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


def test_missing_checkpoint():
    assert_one_line_error(["ringtrain", "--resume", "/nonexistent/ckpt-3"], "/nonexistent/ckpt-3")


def test_unreadable_checkpoint_is_reported_and_kept(tmp_path):
    prefix = tmp_path / "ckpt-1"
    (tmp_path / "ckpt-1.index").write_bytes(b"\x00garbage index")
    (tmp_path / "ckpt-1.data-00000-of-00001").write_bytes(b"garbage")
    cmd = ["ringtrain", "--model", "mnist_mlp", "--steps", "1", "--resume", str(prefix), *ONE_THREAD]
    code, out, err, seconds = run(cmd, timeout=60)
    assert code == 2 and seconds < 30 and "Traceback" not in err
    assert f"cannot restore checkpoint {prefix}" in err.strip().splitlines()[-1]
    assert (tmp_path / "ckpt-1.index").read_bytes() == b"\x00garbage index"


def test_bad_input_on_two_ranks_fails_fast_without_hanging():
    code, out, err, seconds = run(horovodrun(2, "--data-dir", "/nonexistent/mnist"), timeout=60)
    assert code != 0 and seconds < 30
    assert "/nonexistent/mnist" in err + out


def test_a_dead_rank_ends_the_job_instead_of_hanging():
    cmd = horovodrun(2, "--model", "mnist_cnn", "--steps", "100000", "--log-every", "5",
                     *ONE_THREAD)
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in proc.stdout:  # wait until both ranks are training
            if "step 5/" in line:
                break
        ranks = subprocess.run(["pgrep", "-g", str(proc.pid), "-f", "bin/ringtrain"],
                               capture_output=True, text=True).stdout.split()
        victim = max(int(pid) for pid in ranks)
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        proc.wait(timeout=60)
        assert proc.returncode != 0
        assert time.monotonic() - start < 60
    finally:
        kill_group(proc)
