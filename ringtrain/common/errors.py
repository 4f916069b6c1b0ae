"""Errors the CLIs print as one line, and their exit statuses: bad input
(2), a run stopped on purpose (3), a run stopped by a scheduler's signal with
its checkpoint written (75)."""

EXIT_STOPPED = 3  # training stopped on purpose (diverged, stalled, a full disk): resume it
# "stopped early, resumable" (sysexits' EX_TEMPFAIL: a temporary failure, try again): the
# sbatch scripts requeue a job that ends with it.
EXIT_PREEMPTED = 75


class UsageError(Exception):
    """Bad user input (flag, path, file). The message names it and the fix."""


class TrainingStopped(Exception):
    """Training stopped on purpose (a diverged run): one line, exit 3. `quiet`
    on the processes whose peer already says it, so the line appears once."""

    def __init__(self, message, quiet=False):
        super().__init__(message)
        self.quiet = quiet


class Preempted(Exception):
    """Training stopped on a scheduler's signal, at a step every process agreed
    on, and the chief has said so in one line. The chief exits EXIT_PREEMPTED
    if it wrote its checkpoint (EXIT_STOPPED if it had nowhere to); the others
    exit 0, so that no launcher takes them for a failure and ends the job."""

    def __init__(self, saved, chief):
        super().__init__("stopped by a signal")
        self.saved, self.chief = saved, chief


def first_line(error):
    """The first line of an exception's message (TF's run to dozens), or its type."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def one_line(error):
    """An error's text on one line: a message may quote another exception's,
    and some (pickle's) hold newlines."""
    return " ".join(str(error).split())


def run_cli(prog, main, argv=None, exit_at_once=False):
    """Run main(argv); a UsageError becomes one line on stderr and exit 2.
    exit_at_once: end the process as soon as main returns (exit_now)."""
    import faulthandler
    import sys
    # A crash in native code (TF, Horovod, MPI) prints every thread's Python stack
    # before the launcher names the signal; OpenMPI keeps this handler, not its own.
    faulthandler.enable(all_threads=True)
    try:
        code = main(argv)
        return exit_now(code) if exit_at_once else code
    except UsageError as e:
        if launched_rank() in (None, 0):  # every rank sees the same bad input: rank 0 says it
            sys.stderr.write(f"{prog}: error: {one_line(e)}\n")
        else:
            _let_rank_0_speak()
        return 2
    except Preempted as e:
        exit_now(EXIT_PREEMPTED if e.chief and e.saved else EXIT_STOPPED if e.chief else 0)
    except TrainingStopped as e:
        if not e.quiet:
            sys.stderr.write(f"{prog}: error: {one_line(e)}\n")
        else:
            _let_rank_0_speak()
        # A stopped run ends now: TF's collective mode would wait at its shutdown barrier
        # for workers still blocked in a collective with this one.
        exit_now(EXIT_STOPPED)
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130


def exit_now(code):
    """End this process now, its output flushed. A process that has loaded
    TensorFlow otherwise spends about 1.5 s of CPU tearing its modules and
    objects down at exit, long after its files are written and closed."""
    import os
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    remove_generated_code()
    os._exit(code or 0)


def remove_generated_code():
    """What the atexit hooks that os._exit skips would delete: the file AutoGraph
    wrote for each function it converted (TF's own too: a checkpoint's save under
    ParameterServerStrategy), a module in sys.modules named after it, and the
    bytecode Python cached beside it where PYTHONDONTWRITEBYTECODE is unset
    (AutoGraph's own hook leaves that in $TMPDIR/__pycache__), and that folder
    once it is empty. Also an atexit hook of every process that loads TF
    (tfenv.import_tensorflow_quietly)."""
    import os
    import sys
    folders = set()
    for name, module in list(sys.modules.items()):
        if name.startswith("__autograph_generated_file"):
            cached = getattr(module, "__cached__", None)
            for path in (getattr(module, "__file__", None), cached):
                try:
                    os.remove(path)
                except (TypeError, OSError):
                    continue
                if path == cached:
                    folders.add(os.path.dirname(path))
    for folder in folders:
        try:
            os.rmdir(folder)  # (fails, and stays, while anything else is in it)
        except OSError:
            pass


def launched_rank():
    """This process's rank when mpirun or horovodrun started it, else None."""
    import os
    for name in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def launched_size():
    """How many ranks mpirun, horovodrun or srun started (TF_CONFIG's workers), else None."""
    import json
    import os
    for name in ("OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    try:
        return len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
    except (KeyError, ValueError, TypeError):
        return None


def _let_rank_0_speak(seconds=2.0):
    """A quiet rank's exit makes the launcher end the others: wait a moment,
    so that rank 0, which says the same thing, is not ended before it has."""
    import time
    time.sleep(seconds)
