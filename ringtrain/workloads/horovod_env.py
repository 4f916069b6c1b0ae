"""Horovod's and OpenMPI's knobs as the environment variables they read in
hvd.init() / MPI_Init: one mapping for the trainer and the bench."""
import ipaddress
import os
import socket

from ringtrain.workloads.stall import AFTER_THE_WATCHDOG

# OpenMPI busy-polls while a rank waits in a collective, and Horovod's
# background thread waits in one every cycle: on CPU ranks that share cores
# with TF's compute, that spinning steals the compute's time.
MPI_YIELD_WHEN_IDLE = {"OMPI_MCA_mpi_yield_when_idle": "1"}
# Across hosts, OpenMPI's TCP transport with one connection per pair of ranks moved
# 62-64 MB/s each way over a 1 Gbit/s link when both ways were busy at once (as in a
# 2-rank ring's exchange), against 113-119 MB/s with two connections.
MPI_TCP_LINKS = {"OMPI_MCA_btl_tcp_links": "2"}


# Horovod's data path for CPU tensors under mpirun (HOROVOD_CPU_OPERATIONS; Gloo's
# needs patch 0008). Across hosts OpenMPI's blocking MPI_Allreduce polls for the whole
# transfer, and that thread took 31-48 % of a core on 2 simulated hosts sharing 2 cores,
# where Gloo's, blocked in the kernel, took 2-5 %; its steps were 1.45x as long. On one
# host OpenMPI's shared memory is the faster (65 ms steps against Gloo's loopback 74 ms).
# Where Gloo carries the tensors it coordinates the rounds too (HOROVOD_CONTROLLER,
# patch 0014): MPI's controller negotiated each round with MPI collectives over TCP.
CPU_OPERATIONS = ("auto", "mpi", "gloo")


def ranks_span_hosts(environ=None):
    """Whether this job's ranks run on more than one host, as the launcher says before
    MPI starts (mpirun's OMPI_COMM_WORLD_*, or SLURM's step); False when it does not say."""
    env = os.environ if environ is None else environ
    size, local = env.get("OMPI_COMM_WORLD_SIZE", ""), env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "")
    if size.isdigit() and local.isdigit():
        return int(local) < int(size)
    nodes = env.get("SLURM_STEP_NUM_NODES", "")
    return nodes.isdigit() and int(nodes) > 1


def gloo_can_find_this_host(environ=None):
    """Gloo under mpirun listens on HOROVOD_GLOO_IFACE, or else on the address this host's
    name resolves to: one that only this host reaches (Debian maps its own name to
    127.0.1.1) would leave the other ranks unable to connect."""
    env = os.environ if environ is None else environ
    if env.get("HOROVOD_GLOO_IFACE"):
        return True
    try:
        return not ipaddress.ip_address(socket.gethostbyname(socket.gethostname())).is_loopback
    except (OSError, ValueError):
        return False


def cpu_operations_env(choice="auto", environ=None):
    """{HOROVOD_CPU_OPERATIONS, HOROVOD_CONTROLLER} for `choice` under mpirun; auto is
    Gloo's when the ranks span hosts and Gloo can find this one, else OpenMPI's (Horovod's
    own default). Under horovodrun --gloo (a Gloo rendezvous) Gloo does everything."""
    env = os.environ if environ is None else environ
    if env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return {}
    gloo = choice == "gloo" or (choice == "auto" and ranks_span_hosts(env) and gloo_can_find_this_host(env))
    library = env.get("HOROVOD_CPU_OPERATIONS", "").lower() or ("gloo" if gloo else "mpi")  # a user's own wins
    return {"HOROVOD_CPU_OPERATIONS": library, "HOROVOD_CONTROLLER": "gloo" if library == "gloo" else "mpi"}


def gloo_timeout_env(stall_timeout, environ=None):
    """Gloo's own timeout where ringtrain made Gloo the controller under mpirun: a rank
    waits in Gloo's negotiation for the slowest, and Gloo's default 30 s would end a live
    job whose chief takes longer (a checkpoint, an evaluation). A silent rank is the stall
    watchdog's to name, so Gloo waits AFTER_THE_WATCHDOG longer (a day with it off).
    horovodrun --gloo sets its own (--gloo-timeout-seconds)."""
    env = os.environ if environ is None else environ
    if env.get("HOROVOD_CONTROLLER") != "gloo" or env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return {}
    return {"HOROVOD_GLOO_TIMEOUT_SECONDS": f"{stall_timeout + AFTER_THE_WATCHDOG:.0f}" if stall_timeout else "86400"}


def controller_in_effect(mpi_enabled, environ=None):
    """Who coordinated Horovod's rounds, for the summary (under Gloo's controller MPI may
    still be enabled: it built Gloo's contexts)."""
    env = os.environ if environ is None else environ
    return env.get("HOROVOD_CONTROLLER", "").lower() or ("mpi" if mpi_enabled else "gloo")


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


GLOO_RING = "gloo ring"


def allreduce_algorithm_in_effect(controller, environ=None):
    """What carried the gradients, for the summary."""
    env = os.environ if environ is None else environ
    if controller == "gloo" or env.get("HOROVOD_CPU_OPERATIONS", "").lower() == "gloo":
        return GLOO_RING
    forced = env.get("OMPI_MCA_coll_tuned_allreduce_algorithm", "")
    if env.get("OMPI_MCA_coll_tuned_use_dynamic_rules", "").lower() in ("1", "true") and forced.isdigit():
        names = {number: name for name, number in MPI_ALLREDUCE_ALGORITHMS.items()}
        return f"mpi {names.get(int(forced), forced)}"
    return "mpi default (OpenMPI's choice by size and ranks)"


def horovod_loop_in_effect(environ=None):
    """Which background loop Horovod runs under this environment, for the summary."""
    env = os.environ if environ is None else environ
    return "upstream" if env.get("HOROVOD_EVENT_DRIVEN_LOOP", "1").strip() == "0" else "event"
