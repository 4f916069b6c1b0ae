"""A PS task that takes its place in the cluster from whoever started it:
`mpirun -np P+W ps-baseline --num-ps P ...`, `srun --mpi=pmix ...`, or a plain
`srun ps-baseline ...` under SLURM. The rank decides the task, in the order
TF's SlurmClusterResolver uses: ranks 0..P-1 are PS tasks, the next W are
workers (worker 0, the chief, first), and with --api tf2 the last rank is
the coordinator.

Under MPI each rank picks a free port on its own host and the ranks share
their host:port (multihost.mpi_cluster). Under plain srun there is nobody
to share them with: SlurmClusterResolver gives each task --port-base plus
its place on its node.
"""
import os

from ringtrain.multihost import mpi_cluster
from ringtrain.ps_baseline.options import EXPOSURE_SAID_ENV, NO_RESTARTS_ENV, PROG
from ringtrain.workloads.errors import UsageError

SLURM_TASK_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NODELIST")


def under_slurm():
    return all(name in os.environ for name in SLURM_TASK_VARIABLES)


def started_by_a_launcher():
    return mpi_cluster.under_mpi() or under_slurm()


def jobs(num_ps, size, api):
    """{job: task count} in rank order, for `size` ranks."""
    coordinators = 1 if api == "tf2" else 0
    workers = size - num_ps - coordinators
    if workers < 1:
        raise UsageError(f"{size} rank(s) cannot hold --num-ps {num_ps}"
                         + (" and the tf2 coordinator" if coordinators else "")
                         + f" and a worker: start at least {num_ps + coordinators + 1} (mpirun -np, srun -n)")
    return {"ps": num_ps, "worker": workers, **({"chief": 1} if coordinators else {})}


def place(args):
    """Fill in the classic flags (--ps_hosts, --worker_hosts, --chief_host,
    --job_name, --task_index) from the launcher's ranks."""
    if mpi_cluster.under_mpi():
        rank, addresses = mpi_cluster.addresses()
        counts = jobs(args.num_ps, len(addresses), args.api)
        cluster, at = {}, 0
        for job, count in counts.items():
            cluster[job], at = addresses[at:at + count], at + count
        job, index = task_of(rank, counts)
        launcher = "mpirun"
    elif under_slurm():
        cluster, job, index = _from_slurm(args)
        launcher = "srun"
    else:
        raise UsageError(f"{PROG} without --job_name takes its task from mpirun or srun: give --ps_hosts, "
                         f"--worker_hosts, --job_name and --task_index, or use {PROG} launch")
    args.ps_hosts, args.worker_hosts = ",".join(cluster["ps"]), ",".join(cluster["worker"])
    args.chief_host = ",".join(cluster.get("chief", [])) or None
    args.job_name, args.task_index = job, index
    chief = ("chief", 0) if args.api == "tf2" else ("worker", 0)
    if (job, index) == chief:
        every = [a for hosts in cluster.values() for a in hosts]
        print(f"{PROG}: warning: this job's TF gRPC servers ({', '.join(every)}) listen on every interface of "
              f"their hosts and run any graph sent to them, without authentication: keep those ports closed to "
              f"all but the cluster's hosts", flush=True)
    os.environ[EXPOSURE_SAID_ENV] = "1"
    os.environ[NO_RESTARTS_ENV] = "1"  # (neither launcher restarts a task that dies)
    return launcher


def task_of(rank, counts):
    for job, count in counts.items():
        if rank < count:
            return job, rank
        rank -= count
    raise AssertionError("rank beyond the jobs")


def _from_slurm(args):
    """SlurmClusterResolver's cluster, task type and index for this task."""
    from ringtrain.workloads.tfenv import import_tensorflow_quietly
    tf = import_tensorflow_quietly()
    counts = jobs(args.num_ps, int(os.environ["SLURM_NTASKS"]), args.api)
    try:
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs=counts, port_base=args.port_base, gpus_per_node=0, gpus_per_task=0, auto_set_gpu=False)
        spec = resolver.cluster_spec().as_dict()
    except (RuntimeError, ValueError, OSError) as e:
        raise UsageError(f"SlurmClusterResolver cannot describe this job ({str(e).splitlines()[0]}): run it "
                         f"in a SLURM job step (srun -n {sum(counts.values())} {PROG} ...)") from None
    return {job: list(spec.get(job, [])) for job in counts}, resolver.task_type, int(resolver.task_id)
