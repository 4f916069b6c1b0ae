"""Horovod's and OpenMPI's knobs as the environment variables they read in
hvd.init() / MPI_Init: one mapping for the trainer and the bench."""
import os

# OpenMPI busy-polls while a rank waits in a collective, and Horovod's
# background thread waits in one every cycle: on CPU ranks that share cores
# with TF's compute, that spinning steals the compute's time.
MPI_YIELD_WHEN_IDLE = {"OMPI_MCA_mpi_yield_when_idle": "1"}
# Across hosts, OpenMPI's TCP transport with one connection per pair of ranks moved
# 62-64 MB/s each way over a 1 Gbit/s link when both ways were busy at once (as in a
# 2-rank ring's exchange), against 113-119 MB/s with two connections.
MPI_TCP_LINKS = {"OMPI_MCA_btl_tcp_links": "2"}


# Horovod's background loop (patches/horovod-0.28.1/0004): "event" sleeps until a
# tensor is queued; "upstream" runs a coordination round every cycle, idle or not.
HOROVOD_LOOPS = {"event": "1", "upstream": "0"}


def knob_env(cycle_time_ms=None, fusion_threshold_mb=None, timeline=None, loop=None):
    """{HOROVOD_*: value} for the knobs that are set (None: Horovod's default)."""
    env = {}
    if loop is not None:
        env["HOROVOD_EVENT_DRIVEN_LOOP"] = HOROVOD_LOOPS[loop]
    if cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{cycle_time_ms:g}"
    if fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(fusion_threshold_mb * (1 << 20)))
    if timeline:
        env["HOROVOD_TIMELINE"] = timeline
    return env


# OpenMPI 4.1's allreduce algorithms (coll/tuned), by the number its MCA parameter takes.
# Its own choice by size and rank count is often recursive doubling or Rabenseifner,
# not the classic distributed-TensorFlow tutorials' ring: ring mode asks for the ring (scatter-reduce, then allgather).
MPI_ALLREDUCE_ALGORITHMS = {"basic_linear": 1, "nonoverlapping": 2, "recursive_doubling": 3, "ring": 4,
                            "segmented_ring": 5, "rabenseifner": 6}


def mpi_allreduce_env(algorithm):
    """Env that makes OpenMPI's MPI_Allreduce use `algorithm` ('default': its own choice)."""
    if algorithm in (None, "default"):
        return {}
    return {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
            "OMPI_MCA_coll_tuned_allreduce_algorithm": str(MPI_ALLREDUCE_ALGORITHMS[algorithm])}


def ringtrains_mpi_env(algorithm="ring", busy_wait=False):
    """The OpenMPI settings ring mode trains with: `algorithm`'s allreduce, two TCP
    links per peer, and ranks that yield while they wait (not with busy_wait)."""
    return dict(mpi_allreduce_env(algorithm), **MPI_TCP_LINKS, **({} if busy_wait else MPI_YIELD_WHEN_IDLE))


def allreduce_algorithm_in_effect(controller, environ=None):
    """What carried the gradients, for the summary."""
    env = os.environ if environ is None else environ
    if controller == "gloo":
        return "gloo ring"
    forced = env.get("OMPI_MCA_coll_tuned_allreduce_algorithm", "")
    if env.get("OMPI_MCA_coll_tuned_use_dynamic_rules", "").lower() in ("1", "true") and forced.isdigit():
        names = {number: name for name, number in MPI_ALLREDUCE_ALGORITHMS.items()}
        return f"mpi {names.get(int(forced), forced)}"
    return "mpi default (OpenMPI's choice by size and ranks)"


def horovod_loop_in_effect(environ=None):
    """Which background loop Horovod runs under this environment, for the summary."""
    env = os.environ if environ is None else environ
    return "upstream" if env.get("HOROVOD_EVENT_DRIVEN_LOOP", "1").strip() == "0" else "event"
