"""A batch job's command under SLURM, as the sbatch scripts in
mpi_hostfiles/slurm/ run it:

    python -m ringtrain.multihost.requeue mpirun -x PATH ringtrain ...

It passes the scheduler's signals on to the command (SIGUSR1 from `sbatch
--signal=B:USR1@SECONDS` before the time limit, SIGTERM, SIGINT), and when
the command stopped early with its checkpoint written (exit 75), requeues the
job (`scontrol requeue`), as PyTorch Lightning's SLURM environment does: the
job comes back with the same ID, and ringtrain resumes from that job's own
checkpoints by itself. RINGTRAIN_NO_REQUEUE=1 leaves a stopped job ended.
It exits with the command's status.
"""
import os
import signal
import subprocess
import sys

from ringtrain.common.errors import EXIT_PREEMPTED

PASSED_ON = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.stderr.write("usage: python -m ringtrain.multihost.requeue COMMAND [ARGS...]\n")
        return 2
    child = subprocess.Popen(argv)
    for sig in PASSED_ON:
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    code = child.wait()
    job = os.environ.get("SLURM_JOB_ID")
    if code == EXIT_PREEMPTED and job and not os.environ.get("RINGTRAIN_NO_REQUEUE"):
        print(f"ringtrain: job {job} stopped early with its checkpoint written: requeueing it "
              "(it resumes from that checkpoint)", flush=True)
        subprocess.run(["scontrol", "requeue", job], check=False)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
