"""Every output path is checked at start-up (issue 12, "fail early"): under a
file, on a read-only file system, or a directory where a file is wanted, the
run fails in one line within seconds, before any training. A missing folder
for a summary or weights file is made."""
import os
import subprocess

import pytest

from helpers import BENCH, ONE_THREAD, PS_BASELINE, assert_one_line_error, last_json, run_ok

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def blocker(tmp_path):
    """A file where a directory would have to be."""
    path = tmp_path / "a-file"
    path.write_text("x")
    return str(path)


@pytest.fixture
def read_only(tmp_path):
    """A read-only file system of our own (a tmpfs mounted ro), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only file system needs root")
    path = tmp_path / "ro"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "ringtrain-test-ro", str(path)], check=True)
    yield str(path)
    subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--log-dir"])
def test_ringtrain_output_folder_under_a_file_fails_at_once(blocker, flag):
    assert_one_line_error(["ringtrain", flag, os.path.join(blocker, "sub")], f"{flag} ", code=2)


@pytest.mark.parametrize("flag", ["--summary-json", "--dump-weights", "--timeline"])
def test_ringtrain_output_file_under_a_file_fails_at_once(blocker, flag):
    assert_one_line_error(["ringtrain", flag, os.path.join(blocker, "out")], f"{flag} ", code=2)


def test_an_output_file_that_is_a_directory_fails_at_once(tmp_path):
    assert_one_line_error(["ringtrain", "--summary-json", str(tmp_path)], "is a directory", code=2)


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--log-dir", "--summary-json"])
def test_ringtrain_outputs_on_a_read_only_file_system_fail_at_once(read_only, flag):
    line = assert_one_line_error(["ringtrain", flag, os.path.join(read_only, "x")], flag, code=2)
    assert "read-only file system" in line


def test_ps_baseline_outputs_are_checked_before_any_task_starts(blocker, read_only):
    assert_one_line_error([*PS_BASELINE, "launch", "--summary-json", os.path.join(blocker, "s.json")],
                          "--summary-json", code=2)
    assert_one_line_error([*PS_BASELINE, "launch", "--checkpoint-dir", read_only], "read-only", code=2)
    assert_one_line_error([*PS_BASELINE, "towers", "--checkpoint-dir", os.path.join(blocker, "c")],
                          "--checkpoint-dir", code=2)


def test_bench_out_on_a_read_only_file_system_fails_at_once(read_only):
    assert_one_line_error(BENCH + ["scaling", "--out", os.path.join(read_only, "results")], "--out", code=2)


def test_a_missing_folder_for_a_summary_or_weights_is_made(tmp_path):
    summary, weights = tmp_path / "new" / "s.json", tmp_path / "newer" / "w-{rank}.npz"
    out = run_ok(["ringtrain", "--model", "mnist_mlp", "--steps", "5", "--summary-json", str(summary),
                  "--dump-weights", str(weights), *ONE_THREAD])
    assert last_json(out)["steps"] == 5
    assert summary.exists() and (tmp_path / "newer" / "w-0.npz").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs of our own: one mnist_mlp checkpoint (SGD, 2.6 MB) fits, a second does not."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    path = tmp_path / "small"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "ringtrain-test-small", str(path)], check=True)
    yield path
    subprocess.run(["umount", str(path)], check=True)


def test_a_full_disk_at_a_checkpoint_stops_in_one_line_and_keeps_the_older_one(small_disk):
    from helpers import run
    ckpt = small_disk / "ckpt"
    done = run(["ringtrain", "--model", "mnist_mlp", "--optimizer", "sgd", "--steps", "12", "--checkpoint-every",
                "4", "--checkpoint-dir", str(ckpt), *ONE_THREAD], timeout=100)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("ringtrain")]
    assert errors == [f"ringtrain: error: cannot write the checkpoint of step 8 to {ckpt}: no space left on "
                      f"device; the last good checkpoint is {ckpt}/ckpt-4: free space and resume with --resume"]
    assert not [name for name in os.listdir(ckpt) if "temp" in name or name.startswith("ckpt-8")]
    import tensorflow as tf
    assert tf.train.load_checkpoint(str(ckpt / "ckpt-4")).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 4


@pytest.mark.slow
def test_a_full_disk_at_a_ps_checkpoint_stops_in_one_line_and_keeps_the_older_one(tmp_path):
    """The chief's first checkpoint fits; then the disk fills (we fill it), and the next one does not."""
    import time
    from helpers import Tasks
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "ringtrain-test-ps-disk", str(disk)], check=True)
    try:
        ckpt = disk / "ckpt"
        with Tasks(str(tmp_path)) as tasks:
            tasks.start("launch", [*PS_BASELINE, "launch", "--num-ps", "1", "--num-workers", "1", "--model",
                                   "mnist_mlp", "--optimizer", "sgd", "--simulate-gpu", "50", "--steps", "100000",
                                   "--log-every", "100000", "--checkpoint-every", "40", "--checkpoint-dir", str(ckpt),
                                   *ONE_THREAD])
            deadline = time.monotonic() + 120
            while not (ckpt / "model.ckpt-0.index").exists():
                assert time.monotonic() < deadline and tasks.procs["launch"].poll() is None, tasks.log("launch")
                time.sleep(0.2)
            with open(disk / "filler", "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * (256 * 1024))
                except OSError:
                    f.truncate(max(f.tell() - 256 * 1024, 0))  # a quarter MB left: no checkpoint fits
            assert tasks.wait("launch", 120) == 3
            log = tasks.log("launch")
        said = [line for line in log.splitlines() if "cannot write the checkpoint" in line]
        assert len(said) == 1 and "Traceback" not in log, log[-3000:]
        assert said[0].endswith(f"cannot write the checkpoint of step 40 to {ckpt}: no space left on device; the "
                                f"last good checkpoint is {ckpt}/model.ckpt-0: free space and restart the cluster "
                                f"with the same --checkpoint-dir"), said
        assert not [name for name in os.listdir(ckpt) if "temp" in name or name.startswith("model.ckpt-40")]
    finally:
        subprocess.run(["umount", str(disk)], check=True)
