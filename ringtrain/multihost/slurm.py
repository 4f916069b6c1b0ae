"""A real SLURM on a simulated cluster (`ringtrain-cluster up --slurm`):
Debian's Slurm 22.05 daemons, each in its host's namespaces, as on N nodes.

    every host hK: munged (the cluster's key) and `slurmd -N hK`, on hK's address
    h1 also:       slurmctld, the controller (SlurmctldHost=h1)

Each host sees its own /etc/slurm/slurm.conf and /etc/munge/ (key, socket):
`ip netns exec`, which started the host's sshd, binds /etc/netns/NS/* over
/etc, and every process of the host shares that sshd's mount namespace. So
srun, sbatch and scancel work on a host with no flag, and a node whose
processes are killed loses its munged and slurmd, as a real node would. The
slurm.conf is the same file on every host; spool, logs and PID files live in
the cluster's state folder, per node (`%n`), and go with `down`.

No cgroups and no systemd here: processes are tracked by their parent links
(proctrack/linuxproc: a job's processes that start sessions of their own, as
ringtrain's launchers do, are still its descendants; proctrack/pgid would lose
them) and tasks are not bound to cores (task/none: 2 cores are shared by every
simulated node). Nodes claim 2 CPUs each, whatever the machine has
(SlurmdParameters=config_overrides).
"""
import os
import shutil
import subprocess
import time

from ringtrain.common.errors import UsageError
from ringtrain.multihost.host_namespaces import NETNS_ETC, enter_argv

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scancel", "sinfo", "squeue", "scontrol")
PACKAGES = "munge slurmctld slurmd slurm-client"
MUNGE_SOCKET = "/etc/munge/munge.socket.2"  # each host's own munged (its /etc is its own)
CPUS_PER_NODE = 2
# slurmd loads a cgroup plugin whatever the proctrack and task plugins; left to autodetect,
# it looks for a cgroup file system on /sys/fs/cgroup, which a host's own /sys (ip netns
# exec mounts a fresh sysfs) does not have, and slurmd stops. Named, cgroup/v1 loads
# without touching the file system, and nothing here asks it for a cgroup.
CGROUP_CONF = "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"
START_TIMEOUT_SEC = 60
# A node that stops answering is marked DOWN, and its jobs end, after this long.
SLURMD_TIMEOUT_SEC = 10


def binary(name):
    return shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin:" + os.environ.get("PATH", ""))


def check_installed():
    missing = [name for name in DAEMONS + CLIENTS if not binary(name)]
    if missing:
        raise UsageError(f"SLURM is not installed ({', '.join(missing)} missing): apt-get install {PACKAGES} "
                         "(or `make install`)")


def etc_dirs(cluster, host):
    """The folders bound over a host's /etc/slurm and /etc/munge."""
    base = os.path.join(NETNS_ETC, host.netns)
    return os.path.join(base, "slurm"), os.path.join(base, "munge")


def state_dir(cluster):
    return os.path.join(cluster.state_dir, "slurm")


def log_files(cluster):
    """{daemon's place: its log} as conf_text names them: "ctld" for slurmctld, each
    host's name for its slurmd."""
    state = state_dir(cluster)
    return {"ctld": os.path.join(state, "ctld", "slurmctld.log"),
            **{h.name: os.path.join(state, h.name, "slurmd.log") for h in cluster.hosts}}


def prepare(cluster):
    """Before the hosts' sshds start (their mount namespaces bind these
    folders): each host's /etc/slurm and /etc/munge, with the config and key."""
    check_installed()
    key = os.urandom(1024)
    conf = conf_text(cluster)
    for host in cluster.hosts:
        slurm_etc, munge_etc = etc_dirs(cluster, host)
        os.makedirs(slurm_etc, exist_ok=True)
        os.makedirs(munge_etc, mode=0o755, exist_ok=True)
        os.chmod(munge_etc, 0o755)  # munged wants its socket's folder searchable by all, writable by root only
        with open(os.path.join(slurm_etc, "slurm.conf"), "w") as f:
            f.write(conf)
        with open(os.path.join(slurm_etc, "cgroup.conf"), "w") as f:
            f.write(CGROUP_CONF)
        # PMIx's per-step client folder, by default in /tmp, which every simulated node
        # shares: two nodes of one step would make the same folder (and the second fails).
        pmix = os.path.join(state_dir(cluster), host.name, "pmix")
        os.makedirs(pmix, exist_ok=True)
        with open(os.path.join(slurm_etc, "mpi.conf"), "w") as f:
            f.write(f"PMIxCliTmpDirBase={pmix}\n")
        path = os.path.join(munge_etc, "munge.key")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        os.makedirs(os.path.join(state_dir(cluster), host.name, "spool"), exist_ok=True)
    os.makedirs(os.path.join(state_dir(cluster), "ctld"), exist_ok=True)


def conf_text(cluster):
    state = state_dir(cluster)
    first = cluster.hosts[0]
    nodes = "".join(f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} CPUs={CPUS_PER_NODE} "
                    "State=UNKNOWN\n" for h in cluster.hosts)
    return f"""# ringtrain-cluster {cluster.name}: made by `ringtrain-cluster up --slurm`, removed by `down`
ClusterName={cluster.name}
SlurmctldHost={first.name}({first.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={MUNGE_SOCKET}
CredType=cred/munge
StateSaveLocation={state}/ctld
SlurmctldPidFile={state}/ctld/slurmctld.pid
SlurmctldLogFile={state}/ctld/slurmctld.log
SlurmdSpoolDir={state}/%n/spool
SlurmdPidFile={state}/%n/slurmd.pid
SlurmdLogFile={state}/%n/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
# no cgroups or systemd here: track a job's processes by their parents, bind no cores
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
# (look at pending jobs every 2 s, not every 60: a requeued job comes back in seconds once eligible)
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_SEC}
SlurmctldTimeout=10
MessageTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=300
{nodes}PartitionName=sim Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def start(cluster, log=print):
    """munged and slurmd on every host, slurmctld on h1; returns once SLURM
    sees every node idle, or raises a UsageError naming what did not come up."""
    state = state_dir(cluster)

    def daemon(host, name, argv):
        logfile = os.path.join(state, host.name if name != "slurmctld" else "ctld", f"{name}.out")
        with open(logfile, "w") as out:
            subprocess.Popen(enter_argv(cluster, host.name, argv, cwd="/"), stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        return logfile

    for host in cluster.hosts:
        own = os.path.join(state, host.name)
        daemon(host, "munged", [binary("munged"), "--foreground", f"--socket={MUNGE_SOCKET}",
                                "--key-file=/etc/munge/munge.key", f"--pid-file={own}/munged.pid",
                                f"--log-file={own}/munged.log", f"--seed-file={own}/munged.seed"])
    _wait(lambda: all(os.path.exists(os.path.join(etc_dirs(cluster, h)[1], "munge.socket.2"))
                      for h in cluster.hosts), "munged", os.path.join(state, "h1", "munged.log"))
    daemon(cluster.hosts[0], "slurmctld", [binary("slurmctld"), "-D", "-i"])
    for host in cluster.hosts:
        daemon(host, "slurmd", [binary("slurmd"), "-D", "-N", host.name])
    states = {}

    def all_idle():
        states.update(node_states(cluster))
        return states and all(s.startswith("idle") for s in states.values()) and len(states) == len(cluster.hosts)

    try:
        _wait(all_idle, "slurmctld and every slurmd", log_files(cluster)["ctld"])
    except UsageError:
        late = [h.name for h in cluster.hosts if not states.get(h.name, "").startswith("idle")]
        logs = log_files(cluster)
        raise UsageError(f"SLURM did not see every node idle within {START_TIMEOUT_SEC} s (not idle: "
                         + ", ".join(f"{name} {states.get(name, 'unknown')}" for name in late)
                         + f"): see {' and '.join([logs['ctld']] + [logs[name] for name in late])}") from None
    log(f"ringtrain-cluster: SLURM is up: slurmctld on {cluster.hosts[0].name}, slurmd on "
        f"{', '.join(h.name for h in cluster.hosts)} (partition sim, {CPUS_PER_NODE} CPUs per node); "
        f"run its commands on a host: ringtrain-cluster exec h1 -- sbatch ...")


def _wait(condition, what, logfile):
    deadline = time.monotonic() + START_TIMEOUT_SEC
    while not condition():
        if time.monotonic() > deadline:
            raise UsageError(f"{what} did not start within {START_TIMEOUT_SEC} s: see {logfile}")
        time.sleep(0.25)


def node_states(cluster):
    """{node: state} as sinfo prints it on h1 ({} while slurmctld does not answer)."""
    done = subprocess.run(enter_argv(cluster, cluster.hosts[0].name, [binary("sinfo"), "-h", "-N", "-o", "%N %T"],
                                     cwd="/"), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in done.stdout.splitlines() if len(line.split()) == 2)


def status_lines(cluster):
    states = node_states(cluster)
    if not states:
        return ["  SLURM: slurmctld does not answer"]
    return [f"  SLURM: slurmctld on {cluster.hosts[0].name}; nodes " +
            ", ".join(f"{node} {state}" for node, state in sorted(states.items()))]
