"""What the numbers were measured on: versions, cores, threads, launchers."""
import os
import platform
import subprocess
import sys


def _version(module):
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "?")
    except Exception as e:  # a missing optional package is a fact, not an error
        return f"unavailable ({type(e).__name__})"


def _mpirun_version():
    from ringtrain.bench.launch import tool
    try:
        out = subprocess.run([tool("mpirun"), "--version"], capture_output=True, text=True, timeout=20)
        return out.stdout.splitlines()[0].strip()
    except Exception as e:
        return f"unavailable ({e})"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def describe(threads_per_worker=None, hostfile=None, with_tensorflow=False):
    env = {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "cpu_model": _cpu_model(), "cores": usable_cores(), "logical_cpus": os.cpu_count(),
        "numpy": _version("numpy"), "mpi4py": _version("mpi4py"),
        "horovod": _version("horovod"), "mpirun": _mpirun_version(),
        "threads_per_worker": threads_per_worker, "hostfile": hostfile or "localhost (no hostfile)",
        "gpus": 0,
        "load_average_at_start": list(os.getloadavg()),
        "knobs": {k: v for k, v in os.environ.items() if k.startswith(("HOROVOD_", "OMPI_MCA_"))},
    }
    if with_tensorflow:
        from ringtrain.workloads.tfenv import import_tensorflow_quietly
        tf = import_tensorflow_quietly()
        env["tensorflow"] = tf.__version__
        env["gpus"] = len(tf.config.list_physical_devices("GPU"))
    return env
