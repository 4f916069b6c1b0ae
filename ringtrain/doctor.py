"""`ringtrain doctor`: what is installed, what Horovod was built with, whether
mpirun can start 2 ranks here; one-line fixes; non-zero when ring mode can't run."""
import os
import platform
import shutil
import subprocess
import sys

from ringtrain.workloads.tfenv import import_tensorflow_quietly

FIX_INSTALL = "run `make install` in the ringtrain checkout"


class Report:
    def __init__(self):
        self.problems = []  # (what, fix) that stop ring mode

    def line(self, key, value):
        print(f"{key:<22} {value}")

    def problem(self, what, fix):
        self.problems.append((what, fix))


def versions(report):
    from ringtrain.common.version import __version__
    report.line("ringtrain", __version__)
    report.line("python", platform.python_version())
    tf = hvd = None
    try:
        tf = import_tensorflow_quietly()
        import keras
        report.line("tensorflow", tf.__version__)
        report.line("keras", keras.__version__)
    except ImportError as e:
        report.line("tensorflow", f"MISSING ({e})")
        report.problem("TensorFlow is not importable", FIX_INSTALL)
    try:
        import horovod
        import horovod.tensorflow as hvd
        report.line("horovod", horovod.__version__)
    except Exception as e:  # a mis-built extension raises more than ImportError
        report.line("horovod", f"MISSING ({type(e).__name__}: {e})")
        report.problem("horovod.tensorflow does not import", FIX_INSTALL + " (rebuilds Horovod)")
    try:
        from mpi4py import MPI
        import mpi4py
        report.line("mpi4py", mpi4py.__version__)
        report.line("mpi library", MPI.Get_library_version().strip().splitlines()[0])
    except Exception as e:
        report.line("mpi4py", f"MISSING ({e})")
        report.problem("mpi4py is missing (the allreduce bench needs it)", FIX_INSTALL)
    return tf, hvd


def horovod_build(report, hvd):
    """The same facts as `horovodrun --check-build`."""
    if hvd is None:
        return
    from horovod.common.util import extension_available
    frameworks = [name for name, module in (("TensorFlow", "tensorflow"), ("PyTorch", "torch"), ("MXNet", "mxnet"))
                  if extension_available(module)]
    controllers = [name for name, ok in (("MPI", hvd.mpi_built()), ("Gloo", hvd.gloo_built())) if ok]
    ops = [name for name, ok in (("NCCL", hvd.nccl_built()), ("DDL", hvd.ddl_built()),
                                 ("CCL", hvd.ccl_built()), ("MPI", hvd.mpi_built()),
                                 ("Gloo", hvd.gloo_built())) if ok]
    report.line("horovod frameworks", ", ".join(frameworks) or "NONE")
    if "TensorFlow" not in frameworks:
        report.problem("Horovod was built without TensorFlow", "rebuild: HOROVOD_WITH_TENSORFLOW=1 via " + FIX_INSTALL)
    report.line("horovod controllers", ", ".join(controllers) or "NONE")
    report.line("horovod tensor ops", ", ".join(ops) or "NONE")
    if not controllers:
        report.problem("Horovod has neither MPI nor Gloo", "rebuild: HOROVOD_WITH_MPI=1 "
                       "HOROVOD_WITH_GLOO=1 via " + FIX_INSTALL)


def mpirun_two_ranks(report):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        report.line("mpirun", "MISSING")
        report.problem("mpirun is not on PATH", "apt-get install openmpi-bin libopenmpi-dev "
                       "(or " + FIX_INSTALL + ")")
        return
    # rank 0 alone prints every rank's number: two ranks printing at once can interleave
    cmd = [mpirun, "-np", "2", "--oversubscribe", sys.executable, "-c",
           "from mpi4py import MPI; ranks = MPI.COMM_WORLD.gather(MPI.COMM_WORLD.Get_rank()); "
           "ranks and print(*ranks)"]
    env = dict(os.environ)
    if os.geteuid() == 0:
        # Only the check sets these; users running as root set them themselves.
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        ok = result.returncode == 0 and result.stdout.split() == ["0", "1"]
    except subprocess.TimeoutExpired:
        ok, result = False, None
    report.line("mpirun -np 2", "ok" if ok else "FAILED")
    if not ok:
        detail = ((result.stderr.strip().splitlines() or
                   [f"exit {result.returncode}, output {result.stdout.strip()[-80:]!r}"])[-1]
                  if result else "timed out after 60 s")
        report.problem(f"mpirun could not start 2 ranks: {detail}",
                       "check `mpirun -np 2 hostname` works; as root export "
                       "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
    elif os.geteuid() == 0 and not os.environ.get("OMPI_ALLOW_RUN_AS_ROOT"):
        print("note: you are root; plain mpirun needs --allow-run-as-root or "
              "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (horovodrun adds it itself)")


def hardware(report, tf):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    report.line("cores", f"{cores} usable of {os.cpu_count()}")
    gpus = tf.config.list_physical_devices("GPU") if tf else []
    report.line("gpus", f"{len(gpus)}" + (f" ({', '.join(g.name for g in gpus)})" if gpus else ""))


def open_doors(report):
    """Where the servers of ringtrain's modes would be reachable from (README: Security)."""
    from ringtrain.multihost.private_net import available
    ok, why_not = available()
    report.line("ps-baseline launch", "its TF gRPC servers (unauthenticated) run in a private network namespace "
                "with loopback only" if ok else f"WARNING: its TF gRPC servers (unauthenticated) listen on every "
                f"interface of this machine ({why_not}): firewall their ports")
    report.line("tf-collective", "each worker's TF gRPC server listens on every interface, unauthenticated")
    report.line("horovodrun", "its rendezvous server listens on every interface (0.0.0.0), unauthenticated, "
                "while a job starts")
    report.line("stall watchdog", "the chief of every job listens on loopback (one host) or the cluster's "
                "interface, token-checked")


def hostfile_check(report, path, ranks):
    """What mpirun and horovodrun would trip on, each said in one line here
    (their own messages run to dozens): the file, names that do not resolve,
    too few slots, hosts that ssh cannot reach or that lack this install."""
    from ringtrain.multihost import hostfile, procs
    from ringtrain.multihost.net import is_local_host
    from ringtrain.common.errors import UsageError
    try:
        hosts = hostfile.read_hostfile(path)
        if ranks:
            hostfile.fill(hosts, ranks, f"hostfile {path}")
    except UsageError as e:
        report.line("hostfile", f"{path}: PROBLEM")
        report.problem(str(e), None)
        return
    bad = []
    for host in hosts:
        if is_local_host(host.name):
            continue
        done = procs.run([sys.executable, "-c", "pass"], host=host.name, timeout=30)
        if done.returncode != 0 or done.timed_out:
            reason = "timed out" if done.timed_out else (done.stderr.strip().splitlines() or ["no reason given"])[-1]
            bad.append(host.name)
            report.problem(f"hostfile {path}: cannot run {sys.executable} on {host.name} over ssh ({reason})",
                           "passwordless ssh (BatchMode) from here to every host, and this install at the same "
                           "path on each (a shared home, or the same image)")
    report.line("hostfile", f"{path}: {len(hosts)} host(s), {sum(h.slots for h in hosts)} slot(s)"
                + (f", {ranks} rank(s) fit" if ranks else "") + ("" if not bad else f"; unreachable: {', '.join(bad)}"))


def parser():
    from ringtrain.common.parsing import OneLineParser, add_version, positive_int
    p = OneLineParser(prog="ringtrain doctor",
                      description="Print versions, Horovod's build, whether mpirun can start 2 ranks, cores and "
                                  "GPUs, and where servers would listen; with --hostfile, check a cluster first. "
                                  "Exits non-zero when ring mode cannot run.")
    add_version(p)
    p.add_argument("--hostfile", metavar="FILE",
                   help="also check this OpenMPI hostfile: syntax, names that resolve, slots, ssh to each host")
    p.add_argument("--np", type=positive_int, metavar="N", help="with --hostfile: the ranks it must hold")
    return p


def main(argv=None):
    args = parser().parse_args(argv or [])
    report = Report()
    tf, hvd = versions(report)
    horovod_build(report, hvd)
    mpirun_two_ranks(report)
    hardware(report, tf)
    open_doors(report)
    if args.hostfile:
        hostfile_check(report, args.hostfile, args.np)
    for what, fix in report.problems:
        print(f"PROBLEM: {what}" + (f" -> fix: {fix}" if fix else ""))
    print("ring mode: " + ("ready" if not report.problems else "CANNOT RUN"))
    return 1 if report.problems else 0
