"""A PS task that takes its place in the cluster from whoever started it:
`mpirun -np P+W ps-baseline --num-ps P ...`, `srun --mpi=pmix ...`, or a plain
`srun -n P+W ps-baseline ...` under SLURM. The rank decides the task, in the
order TF's SlurmClusterResolver gives them (job names sorted): with --api
tf2, rank 0 is the coordinator ("chief"); then P PS tasks; then the workers,
worker 0 (v1's chief) first. Where the tasks serve comes from
multihost.launched: free ports shared through MPI, or under a plain srun
--port-base plus each task's place on its node.
"""
import os

from ringtrain.multihost import launched
from ps_baseline.losses import NO_RESTARTS_ENV
from ps_baseline.options import EXPOSURE_SAID_ENV, PROG
from ringtrain.common.errors import UsageError


def started_by_a_launcher():
    return launched.launcher() is not None


def jobs(num_ps, size, api):
    """{job: task count} in rank order, for `size` ranks."""
    coordinators = 1 if api == "tf2" else 0
    workers = size - num_ps - coordinators
    if workers < 1:
        raise UsageError(f"{size} rank(s) cannot hold --num-ps {num_ps}"
                         + (" and the tf2 coordinator" if coordinators else "")
                         + f" and a worker: start at least {num_ps + coordinators + 1} (mpirun -np, srun -n)")
    return {**({"chief": 1} if coordinators else {}), "ps": num_ps, "worker": workers}


def place(args):
    """Fill in the classic flags (--ps_hosts, --worker_hosts, --chief_host,
    --job_name, --task_index) from the launcher's ranks."""
    rank, addresses = launched.addresses(args.port_base)
    counts = jobs(args.num_ps, len(addresses), args.api)
    cluster, at = {}, 0
    for job, count in counts.items():
        cluster[job], at = addresses[at:at + count], at + count
    job, index = task_of(rank, counts)
    args.ps_hosts, args.worker_hosts = ",".join(cluster["ps"]), ",".join(cluster["worker"])
    args.chief_host = ",".join(cluster.get("chief", [])) or None
    args.job_name, args.task_index = job, index
    chief = ("chief", 0) if args.api == "tf2" else ("worker", 0)
    if (job, index) == chief:
        # The launcher's own messages name ranks: this line makes a dead rank a task.
        tasks = [f"{job}:{i} ({address})" for job, hosts in cluster.items() for i, address in enumerate(hosts)]
        print(f"{PROG}: tasks by {launched.launcher()} rank: "
              + ", ".join(f"{rank} {task}" for rank, task in enumerate(tasks)), flush=True)
        print(f"{PROG}: warning: these TF gRPC servers listen on every interface of their hosts and run any graph "
              "sent to them, without authentication: keep those ports closed to all but the cluster's hosts",
              flush=True)
    os.environ[EXPOSURE_SAID_ENV] = "1"
    os.environ[NO_RESTARTS_ENV] = "1"  # (neither launcher restarts a task that dies)


def task_of(rank, counts):
    for job, count in counts.items():
        if rank < count:
            return job, rank
        rank -= count
    raise AssertionError("rank beyond the jobs")

