"""The cluster flags (--ps_hosts, --worker_hosts, --job_name, --task_index),
parsed and checked without TensorFlow, so that a typo fails in well under a
second with one line instead of a gRPC server that waits forever."""
import socket
from dataclasses import dataclass, field

from ringtrain.multihost.net import is_local_host
from ringtrain.common.errors import UsageError

JOBS = ("ps", "worker", "chief")
LOCAL_HOSTS = {"localhost", "127.0.0.1", "0.0.0.0", "::1", "[::1]", ""}


@dataclass
class Cluster:
    ps: list                 # ["host:port", ...]
    worker: list
    chief: list = field(default_factory=list)  # the TF2 API's coordinator, if any

    def as_dict(self):
        """The dict tf.train.ClusterSpec takes."""
        return {job: hosts for job, hosts in (("ps", self.ps), ("worker", self.worker),
                                              ("chief", self.chief)) if hosts}

    def address(self, job, index):
        return getattr(self, job)[index]

    def tasks(self):
        """(job, index, address) of every task."""
        return [(job, i, a) for job in JOBS for i, a in enumerate(getattr(self, job))]


def parse_hosts(text, flag):
    """'h:p,h:p' -> ['h:p', 'h:p'], with each entry checked."""
    if not text or not text.strip():
        raise UsageError(f"{flag} is empty: give a comma-separated list like localhost:2222,localhost:2223")
    hosts = [part.strip() for part in text.split(",")]
    for entry in hosts:
        split_host_port(entry, flag)
    return hosts


def split_host_port(entry, flag="address"):
    host, sep, port = entry.rpartition(":")
    if not sep or not host or not port:
        raise UsageError(f"{flag}: {entry!r} is not host:port (e.g. localhost:2222)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{flag}: {entry!r} has port {port!r}; ports are integers in 1..65535")
    if any(c.isspace() for c in host):
        raise UsageError(f"{flag}: {entry!r} has whitespace in its host name")
    return host, int(port)


def make_cluster(ps_hosts, worker_hosts, chief_host=None):
    cluster = Cluster(parse_hosts(ps_hosts, "--ps_hosts"), parse_hosts(worker_hosts, "--worker_hosts"),
                      parse_hosts(chief_host, "--chief_host") if chief_host else [])
    check_no_duplicates(cluster)
    return cluster


def _endpoint(address):
    host, port = split_host_port(address)
    return ("localhost" if host in LOCAL_HOSTS else host.lower(), port)


def check_no_duplicates(cluster):
    seen = {}
    for job, index, address in cluster.tasks():
        key = _endpoint(address)
        if key in seen:
            raise UsageError(f"{address} is given to both {seen[key]} and {job} task {index}: "
                             "every task needs its own host:port")
        seen[key] = f"{job} task {index}"


def check_task(cluster, job_name, task_index):
    tasks = getattr(cluster, job_name, None) if job_name in JOBS else None
    if job_name == "chief" and not tasks:
        raise UsageError("--job_name=chief is the TF2 API's coordinator: it needs --api tf2 and --chief_host")
    if tasks is None:
        raise UsageError(f"unknown --job_name {job_name!r}: choose ps or worker")
    if not 0 <= task_index < len(tasks):
        raise UsageError(f"--task_index {task_index} is out of range: the {job_name} job has "
                         f"{len(tasks)} task(s), so use 0..{len(tasks) - 1}")


def check_port_free(address, who):
    """Bind our own port once before TF does, so a busy port is one clear line
    (TF's gRPC server would report it only as a generic start-up failure);
    and a task started on the wrong host is one line too, not a cluster
    whose peers wait for it elsewhere."""
    host, port = split_host_port(address)
    if not is_local_host(host):
        raise UsageError(f"{who} is {address}, but {host} is not this host ({socket.gethostname()}): "
                         f"start it on {host}, or fix the host list")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR ignores TIME_WAIT leftovers of a previous run, not live listeners.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            raise UsageError(f"port {port} of {who} ({address}) is not free: {e.strerror}; "
                             "stop whatever uses it or pick another port") from None
