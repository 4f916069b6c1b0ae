"""Where the bench runs its launches: this machine, the hosts of a hostfile,
the nodes of the SLURM allocation it runs in, or a simulated cluster
(multihost.simcluster) that it brings up and tears down itself, with links
of a given rate.

Launchers start on the first host (on a simulated cluster: inside h1), and
N ranks fill the hosts' slots in order, as mpirun does. With a time
dilation K, a simulated cluster's links run at rate / K while each simulated
accelerator step takes K times as long, which keeps the ratio of
communication to compute of a link K times faster than this machine can
drive; the bench then divides every measured time by K.
"""
import contextlib
import os
from dataclasses import dataclass, field

from ringtrain.multihost import hostfile, simcluster, slurm_step

BENCH_CLUSTER = "rtbench"


@dataclass
class Site:
    label: str                                    # for the tables
    hosts: list = field(default_factory=list)     # [multihost.hostfile.Host]; empty: this machine
    cluster: object = None                        # a simcluster.Cluster the bench brought up
    link_rate: str = None                         # the rate the tables speak of (emulated)
    dilation: float = 1.0

    @property
    def across_hosts(self):
        return bool(self.hosts)

    def hosts_for(self, n):
        """The host of each of n ranks (filled slot by slot), or None on this machine."""
        return hostfile.fill(self.hosts, n, self.label) if self.hosts else None

    def host_list(self, n):
        """mpirun/horovodrun's -H value for n ranks: 'h1:1,h2:1'."""
        counts = {}
        for host in self.hosts_for(n):
            counts[host] = counts.get(host, 0) + 1
        return ",".join(f"{host}:{count}" for host, count in counts.items())

    def write_hostfile(self, n, path):
        """A hostfile of just the hosts n ranks take, so that a launcher places
        its PS tasks among the workers' hosts."""
        counts = {}
        for host in self.hosts_for(n):
            counts[host] = counts.get(host, 0) + 1
        with open(path, "w") as f:
            f.writelines(f"{host} slots={count}\n" for host, count in counts.items())
        return path

    def enter(self, argv):
        """argv as it runs on the first host."""
        if self.cluster is None:
            return list(argv)
        return simcluster.enter_argv(self.cluster, self.hosts[0].name, argv, cwd=os.getcwd())


def this_machine():
    return Site("this machine")


def from_hostfile(path):
    return Site(f"hostfile {path}", hosts=hostfile.read_hostfile(path))


def from_slurm():
    """The nodes of the SLURM job this runs in, one slot per task SLURM gave each."""
    nodes = slurm_step.allocation()
    names = ", ".join(node for node, _ in nodes)
    return Site(f"SLURM job {os.environ.get('SLURM_JOB_ID', '?')} ({names})",
                hosts=[hostfile.Host(node, tasks) for node, tasks in nodes])


@contextlib.contextmanager
def simulated(hosts, link_rate, dilation=1.0, log=print):
    """A simulated cluster of `hosts` hosts whose links emulate `link_rate`
    (shaped at link_rate / dilation), up for the duration of the block."""
    shaped = simcluster.scaled_rate(link_rate, 1.0 / dilation)
    cluster = simcluster.up(BENCH_CLUSTER, hosts, simcluster.Link(shaped), log=log)
    try:
        label = f"simulated cluster, {hosts} hosts, {link_rate} links" + \
            (f" (shaped at {shaped}, time dilation {dilation:g})" if dilation != 1 else "")
        yield Site(label, [hostfile.Host(h.name, 1) for h in cluster.hosts], cluster, link_rate, dilation)
    finally:
        simcluster.down(BENCH_CLUSTER, quiet=True)
