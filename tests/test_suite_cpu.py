"""scripts/suite_cpu.py: the kernel's accounting records read, and each
process's CPU given to the test that started it."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import suite_cpu


def record(pid, ppid, start, seconds, cpu_ticks, name):
    """One acct_v3 record as the kernel writes it: the user time a comp_t, no system time."""
    mantissa, exponent = cpu_ticks, 0
    while mantissa >= 1 << 13:
        mantissa, exponent = mantissa >> 3, exponent + 1
    return suite_cpu.RECORD.pack(0, 3, 0, 0, 0, 0, pid, ppid, start, seconds * suite_cpu.TICKS,
                                 mantissa | exponent << 13, 0, 0, 0, 0, 0, 0, 0, name.encode())


def test_a_record_reads_back_its_process_and_a_large_cpu_time_keeps_its_exponent():
    data = record(41, 7, 1000, 12.5, 5, "ringtrain") + record(42, 41, 1001, 900.0, 80_000, "python")
    first, second = suite_cpu.records(data)
    assert first == {"pid": 41, "ppid": 7, "start": 1000, "seconds": 12.5, "cpu": 0.05, "name": "ringtrain"}
    assert second["cpu"] == 800.0 and second["name"] == "python"  # 80,000 ticks: 10,000 << 3


def test_cpu_goes_to_the_test_whose_worker_started_the_process_even_when_pids_are_reused():
    tests = [{"id": "tests/test_a.py::one", "pid": 10, "start": 100, "end": 200},
             {"id": "tests/test_b.py::two", "pid": 20, "start": 100, "end": 300},
             {"id": "tests/test_a.py::three", "pid": 10, "start": 200, "end": 300}]
    processes = list(suite_cpu.records(b"".join([
        record(500, 10, 110, 50.0, 700, "mpirun"),     # worker 10's launcher, during test one
        record(501, 500, 112, 40.0, 800, "ringtrain"),  # its rank
        record(500, 20, 250, 20.0, 300, "mpirun"),     # pid 500 again, later: worker 20's, test two
        record(502, 500, 251, 10.0, 400, "ringtrain"),
        record(600, 1, 260, 5.0, 1000, "ringtrain"),   # a simulated host's: tests two and three ran then
        record(10, 1, 50, 400.0, 9000, "python"),      # a pytest worker: nobody's test
    ])))
    cpu, elsewhere = suite_cpu.by_test(processes, tests)
    assert cpu == {"tests/test_a.py::one": 15.0, "tests/test_b.py::two": 12.0, "tests/test_a.py::three": 5.0}
    assert elsewhere == 0.0


def test_a_command_without_its_directory_is_refused_with_the_usage(capsys):
    assert suite_cpu.main(["record", "--", "make", "test"]) == 2
    assert "usage: suite_cpu.py record DIR -- COMMAND" in capsys.readouterr().err
