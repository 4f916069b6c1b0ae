"""Where SLURM put us. The tasks of a job step started without MPI (a plain
`srun`), as a TensorFlow cluster: every task's host:port in rank order, as
SLURM's block distribution places ranks (the step's nodes in SLURM's order,
each node's tasks on --port-base, --port-base + 1, ..., as TF's
SlurmClusterResolver numbers them). And the nodes of the allocation that a
batch script runs in, for the bench's launches.

TF's own resolver is not used: it hands out ports by pairing each task with
a GPU of its node, so on a node without GPUs it places no task (or divides
by zero); it also sorts nodes by name, so h10 comes before h2 where SLURM's
ranks put it after.
"""
import os
import re
import subprocess

from ringtrain.common.errors import UsageError

DEFAULT_PORT_BASE = 8888  # SlurmClusterResolver's
STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")


def under_srun():
    return all(name in os.environ for name in STEP_VARIABLES)


def in_allocation():
    return "SLURM_JOB_NODELIST" in os.environ and "SLURM_TASKS_PER_NODE" in os.environ


def allocation():
    """[(node, tasks)] of the job this runs in (sbatch, salloc), in SLURM's order."""
    nodes = hostnames(os.environ["SLURM_JOB_NODELIST"])
    counts = tasks_per_node(os.environ["SLURM_TASKS_PER_NODE"], "SLURM_TASKS_PER_NODE")
    if len(nodes) != len(counts):
        raise UsageError(f"SLURM names {len(nodes)} node(s) but {len(counts)} task count(s) for this job")
    return list(zip(nodes, counts))


def tasks_per_node(text, variable="SLURM_STEP_TASKS_PER_NODE"):
    """SLURM's compressed counts, '2(x3),1' -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise UsageError(f"{variable}={text!r} is not SLURM's task count list")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def hostnames(nodelist):
    """SLURM's compressed node list, expanded by scontrol as SLURM itself does."""
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"cannot expand SLURM's node list {nodelist!r} with scontrol ({e}): run inside a SLURM "
                         "job step on a node with SLURM's commands") from None
    if done.returncode != 0:
        raise UsageError(f"scontrol show hostnames {nodelist!r} failed: {done.stderr.strip()}")
    return done.stdout.split()


def addresses(port_base=DEFAULT_PORT_BASE):
    """(this task's rank, [host:port of every task, in rank order])."""
    env = os.environ
    rank = int(env["SLURM_PROCID"])
    nodes = hostnames(env["SLURM_STEP_NODELIST"])
    counts = tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])
    if len(nodes) != len(counts):
        raise UsageError(f"SLURM names {len(nodes)} node(s) but {len(counts)} task count(s) for this step")
    placed = [(node, port_base + i) for node, count in zip(nodes, counts) for i in range(count)]
    own = (env.get("SLURMD_NODENAME"), int(env.get("SLURM_LOCALID", "-1")))
    if None not in own and placed[rank] != (own[0], port_base + own[1]):
        raise UsageError(f"task {rank} runs as task {own[1]} of {own[0]}, not where a block distribution puts it "
                         f"({placed[rank][0]}): start the step with srun --distribution=block")
    return rank, [f"{node}:{port}" for node, port in placed]
