"""The modes the bench runs: every mode registered in ringtrain/modes.py,
under its own name, and the bench's own variants of some of them (the same
training, started or tuned another way); plus `independent`, N trainers that
exchange nothing, the compute baseline on one machine."""
from ringtrain import modes

# variant -> the registered mode it runs
VARIANTS = {
    "ring-upstream": "ring",    # Horovod's upstream background loop (--horovod-loop upstream)
    "ring-gloo": "ring",        # under horovodrun --gloo, not mpirun
    "ring-mpi": "ring",         # under mpirun, OpenMPI's data path across hosts too (--cpu-operations mpi)
    "ps-sync-backup": "ps-sync",  # W + 1 workers, K = W: one backup worker
}
SCALING_VARIANTS = ("ring-upstream", "ring-gloo", "ring-mpi")  # what a variant asks of the scaling bench's rows
SYNC_VARIANTS = ("ps-sync-backup",)  # what it asks of the straggler and convergence benches
INDEPENDENT = "independent"


def registered(name):
    """The registered mode `name` runs (None for `independent`)."""
    return None if name == INDEPENDENT else modes.by_name(VARIANTS.get(name, name))


def _with_variants(names, variants):
    out = []
    for name in names:
        out.append(name)
        out += [v for v in variants if VARIANTS[v] == name]
    return out


def scaling_modes():
    """`ringtrain-bench scaling --modes`' choices, registry order, each variant after its mode."""
    return tuple(_with_variants([m.name for m in modes.benched()], SCALING_VARIANTS) + [INDEPENDENT])


def sync_against_async_modes():
    """What the straggler and convergence benches weigh, as the classic tutorials weigh sync against
    async: every mode whose workers are processes of their own, each stepping on its own batch."""
    return tuple(_with_variants([m.name for m in modes.benched() if not m.one_process], SYNC_VARIANTS))


def exchange(name):
    """What carries `name`'s gradients: "horovod", "tf", "ps", "none"."""
    mode = registered(name)
    return mode.exchange if mode else "none"


def is_ring(name):
    """Horovod's ring (under mpirun or horovodrun)."""
    return exchange(name) == "horovod"


def all_reduces(name):
    """Its workers all-reduce their gradients with a ring: Horovod's, or TF's own."""
    return exchange(name) in ("horovod", "tf")


def one_timer(name):
    """One process drives (and times) all N workers."""
    mode = registered(name)
    return bool(mode and mode.one_process)


def one_machine(name):
    """It never runs across hosts: one process, or no exchange."""
    mode = registered(name)
    return mode is None or not mode.across_hosts


def synchronous(name):
    """Every update waits for every worker's gradients."""
    mode = registered(name)
    return bool(mode and mode.sync)
