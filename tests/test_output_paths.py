"""Every output path is checked at start-up: under a
file, on a read-only file system, or a directory where a file is wanted, the
run fails in one line within seconds, before any training. A missing folder
for a summary or weights file is made."""
import os

import pytest

from helpers import BENCH, ONE_THREAD, PS_BASELINE, assert_one_line_error, last_json, own_tmpfs, run_ok

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
    with own_tmpfs(tmp_path / "ro", "ringtrain-test-ro", "ro,size=1m") as path:
        yield str(path)


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


@pytest.mark.slow
def test_a_missing_folder_for_a_summary_or_weights_is_made(tmp_path):
    summary, weights = tmp_path / "new" / "s.json", tmp_path / "newer" / "w-{rank}.npz"
    out = run_ok(["ringtrain", "--model", "mnist_mlp", "--steps", "5", "--summary-json", str(summary),
                  "--dump-weights", str(weights), *ONE_THREAD])
    assert last_json(out)["steps"] == 5
    assert summary.exists() and (tmp_path / "newer" / "w-0.npz").exists()
