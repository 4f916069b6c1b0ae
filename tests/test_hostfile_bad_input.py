"""A bad hostfile, or bad flags for where to run, given to a launcher or the
bench, is one line naming the problem within 10 s, before anything starts on
any host."""

import pytest

from ringtrain.bench.launch import child_env
from helpers import BENCH, PS_BASELINE, TINY, assert_one_line_error


pytestmark = pytest.mark.timeout(60)
BAD_HOSTFILES = [  # (hostfile text, what the one line must say); 2 ranks or workers are asked for
    ("localhost slots=1\nno-such-host-rt.invalid slots=1\n", "unknown host 'no-such-host-rt.invalid'"),
    ("localhost slots=1\nlocalhost:2\n", "line 2 ('localhost:2')"),
    ("localhost slots=1\n", "has 1 slot(s) (localhost slots=1) but 2 are needed"),
]


@pytest.mark.parametrize("text,expected", BAD_HOSTFILES)
def test_ps_launch_rejects_a_bad_hostfile_in_one_line(tmp_path, text, expected):
    path = tmp_path / "hosts"
    path.write_text(text)
    assert_one_line_error([*PS_BASELINE, "launch", "--hostfile", str(path), "--num-workers", "2", *TINY],
                          expected, code=2)


def test_ps_launch_names_a_missing_hostfile(tmp_path):
    assert_one_line_error([*PS_BASELINE, "launch", "--hostfile", str(tmp_path / "none"), *TINY],
                          f"hostfile {tmp_path / 'none'} does not exist", code=2)


@pytest.mark.parametrize("extra,expected", [
    (["--np", "1,3", "--cluster", "2"], "--np 3 needs at least that many hosts: --cluster 3"),
    (["--link-rate", "10gbit"], "add --cluster H"),
    (["--cluster", "2", "--time-dilation", "10"], "--time-dilation slows the simulated accelerator"),
    (["--cluster", "2", "--link-rate", "fast"], "'fast': write tc rates such as 1gbit,10gbit"),
])
def test_bad_site_flags_are_one_line(tmp_path, extra, expected):
    assert_one_line_error([*BENCH, "scaling", *extra, "--out", str(tmp_path)], expected, code=2, env=child_env())


def test_a_hostfile_with_too_few_slots_is_one_line(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=1\n")
    assert_one_line_error([*BENCH, "scaling", "--hostfile", str(hosts), "--np", "1,2", "--out", str(tmp_path)],
                          "has 1 slot(s) (localhost slots=1) but 2 are needed", code=2, env=child_env())


@pytest.mark.slow
@pytest.mark.parametrize("text,expected", BAD_HOSTFILES)
def test_doctor_checks_a_hostfile_before_mpirun_or_horovodrun_trip_on_it(tmp_path, text, expected):
    """mpirun and horovodrun print 12-35 lines for these; the pre-flight says each in one."""
    from helpers import run
    path = tmp_path / "hosts"
    path.write_text(text)
    done = run(["ringtrain", "doctor", "--hostfile", str(path), "--np", "2"], timeout=60)
    assert done.returncode == 1
    problems = [line for line in done.stdout.splitlines() if line.startswith("PROBLEM: hostfile")]
    assert len(problems) == 1 and expected in problems[0], done.stdout + done.stderr


@pytest.mark.slow
def test_doctor_passes_a_good_hostfile(tmp_path):
    from helpers import run
    path = tmp_path / "hosts"
    path.write_text("localhost slots=2\n")
    done = run(["ringtrain", "doctor", "--hostfile", str(path), "--np", "2"], timeout=60)
    assert done.returncode == 0, done.stdout
    assert f"hostfile               {path}: 1 host(s), 2 slot(s), 2 rank(s) fit" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("hosts,gloo,expected", [
    ("no-such-host-rt.invalid:1,localhost:1", False, "cannot reach no-such-host-rt.invalid"),
    ("localhost:1", True, "-np 2 needs 2 slots, but the hosts given (-H, -hostfile) have 1"),
])
def test_horovodrun_says_its_own_errors_in_one_line(hosts, gloo, expected):
    """Unpatched, horovodrun prints a 12- and a 25-line traceback for these (and
    under --gloo counts the slots only after checking its build: 11.5 s here)."""
    from helpers import horovodrun
    assert_one_line_error(horovodrun(2, "--steps", "2", gloo=gloo, hosts=hosts), expected, code=2)
