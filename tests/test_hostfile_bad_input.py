"""A bad hostfile, given to a launcher, is one line naming the problem within
10 s, before anything starts on any host."""
import pytest

from helpers import PS_BASELINE, TINY, assert_one_line_error

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("text,expected", [
    ("localhost slots=1\nno-such-host-rt.invalid slots=1\n", "unknown host 'no-such-host-rt.invalid'"),
    ("localhost slots=1\nlocalhost:2\n", "line 2 ('localhost:2')"),
    ("localhost slots=1\n", "has 1 slot(s) (localhost slots=1) but 2 are needed"),
])
def test_ps_launch_rejects_a_bad_hostfile_in_one_line(tmp_path, text, expected):
    path = tmp_path / "hosts"
    path.write_text(text)
    assert_one_line_error([*PS_BASELINE, "launch", "--hostfile", str(path), "--num-workers", "2", *TINY],
                          expected, code=2)


def test_ps_launch_names_a_missing_hostfile(tmp_path):
    assert_one_line_error([*PS_BASELINE, "launch", "--hostfile", str(tmp_path / "none"), *TINY],
                          f"hostfile {tmp_path / 'none'} does not exist", code=2)
