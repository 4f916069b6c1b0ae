"""A simulated cluster on one machine: hosts h1..hN, each a network
namespace with its own hostname (a UTS namespace), its own /etc/hosts and
ssh client config (`ip netns exec` binds /etc/netns/NS/* over /etc), an
interface named eth0 on a shaped link to a bridge, and an sshd that takes
only this cluster's key. The hosts share this machine's filesystem, as
cluster nodes with a shared home directory do.

    switch namespace NAME-sw: bridge br0 <- veth h1 .. hN (tc netem egress: rate, delay, loss)
    host namespace NAME-hK:   eth0 198.18.S.K/24 (tc netem egress), lo; sshd on 198.18.S.K:22

The addresses come from 198.18.0.0/15 (RFC 2544, for benchmarks): never a
real network. The root namespace gets one route, `unreachable
198.18.S.0/24`, added before anything starts and removed last, so that
nothing sent to a cluster address can leave the machine by the default
route. Every process of a host shares its sshd's namespaces; the sshd's
PID is the host's handle, and `down` ends every process in a host's
network namespace.
"""
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
import zlib
from dataclasses import asdict, dataclass, field

from ringtrain.multihost import slurm as slurm_
from ringtrain.multihost.host_namespaces import NETNS_ETC, enter_argv, host_env, is_our_sshd
from ringtrain.common.errors import UsageError

STATE_ROOT = "/run/ringtrain-cluster"
FAILED_UP_LOGS = "/var/log/ringtrain-cluster"  # the logs of an `up` that failed, which `down` does not remove
PRIVSEP_DIR = "/run/sshd"
SUPERNET = (198, 18)          # 198.18.0.0/15 (RFC 2544); each cluster takes a /24 of it
IFACE = "eth0"                # the same interface name on every host, as horovodrun needs
CLONE_NEWUTS = 0x04000000
RATE = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?)(bit|bps)$")
DELAY = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")
NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")


@dataclass
class Link:
    rate: str = "1gbit"
    delay: str = "0ms"
    loss: float = 0.0

    @property
    def bits_per_sec(self):
        return rate_bits_per_sec(self.rate)

    @property
    def needs_netem(self):
        return _seconds(self.delay) > 0 or self.loss > 0

    def qdisc_args(self):
        """tc qdisc words: netem where a delay or loss is asked for, else a
        token bucket (tbf), which every kernel here has. Bursts must pass
        whole GSO packets (64 KiB), and the queue holds ~20 ms at the rate."""
        if self.needs_netem:
            return ["netem", "rate", self.rate, "delay", self.delay, "loss", f"{self.loss:g}%", "limit", "10000"]
        burst = max(256 * 1024, int(self.bits_per_sec / 8 / 1000))  # >= 1 ms at the rate
        return ["tbf", "rate", self.rate, "burst", str(burst), "latency", "20ms"]


def rate_bits_per_sec(text):
    """A tc rate ('1gbit', '100mbit', '125mbps': bits or bytes per second, SI prefixes)."""
    m = RATE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a tc rate")
    value, prefix, unit = m.groups()
    return float(value) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[prefix] * (8 if unit == "bps" else 1)


def scaled_rate(text, factor):
    """A tc rate times `factor`, as a tc rate in kbit ('10gbit' x 0.1 -> '1000000kbit')."""
    return f"{max(1, round(rate_bits_per_sec(text) * factor / 1e3))}kbit"


def _seconds(text):
    value, unit = re.match(r"^([\d.]+)(us|ms|s)$", text).groups()
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


@dataclass
class HostState:
    name: str       # h1
    netns: str      # NAME-h1
    address: str    # 198.18.S.1
    sshd_pid: int = 0


@dataclass
class Cluster:
    name: str
    subnet: str                 # 198.18.S.0/24
    link: Link
    hosts: list = field(default_factory=list)
    slurm: bool = False         # a SLURM runs on the hosts (multihost/slurm.py)

    @property
    def state_dir(self):
        return os.path.join(STATE_ROOT, self.name)

    @property
    def session_tmp(self):
        """Where OpenMPI keeps its session folders on every host (orte_tmpdir_base):
        removed with the cluster. In the machine's shared /tmp, a crashed host's
        daemon left its folder behind."""
        return os.path.join(self.state_dir, "tmp")

    @property
    def switch(self):
        return f"{self.name}-sw"

    @property
    def hostfile(self):
        return os.path.join(self.state_dir, "hostfile")

    def host(self, name):
        for h in self.hosts:
            if h.name == name:
                return h
        raise UsageError(f"no host {name!r} in cluster {self.name}: it has "
                         f"{', '.join(h.name for h in self.hosts)}")

    def save(self):
        with open(os.path.join(self.state_dir, "state.json"), "w") as f:
            json.dump({"name": self.name, "subnet": self.subnet, "link": asdict(self.link),
                       "hosts": [asdict(h) for h in self.hosts], "slurm": self.slurm}, f, indent=1)


# --- checks -----------------------------------------------------------------

def check_can_build():
    """One line, exit non-zero, where namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise UsageError("a simulated cluster needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create "
                         "network namespaces: run as root")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nsenter", "util-linux"),
                          ("sshd", "openssh-server"), ("ssh", "openssh-client"),
                          ("ssh-keygen", "openssh-client")):
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            raise UsageError(f"{tool} is not installed: apt-get install {package} (or `make install`)")
    probe = f"rtprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        raise UsageError("cannot create network namespaces here (`ip netns add` said: "
                         f"{made.stderr.strip() or made.returncode}): a container needs CAP_SYS_ADMIN "
                         "and CAP_NET_ADMIN")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def check_name(name):
    if not NAME.match(name):
        raise UsageError(f"--name {name!r}: use 1-10 lowercase letters and digits, starting with a letter")
    return name


def netem_available():
    """Whether this kernel has the netem qdisc (some container kernels lack it)."""
    probe = f"rtnetem{os.getpid()}"
    sh("ip", "netns", "add", probe)
    try:
        return sh("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                  check=False).returncode == 0
    finally:
        sh("ip", "netns", "del", probe, check=False)


def check_link(link):
    if not RATE.match(link.rate):
        raise UsageError(f"--link-rate {link.rate!r}: write a tc rate such as 1gbit, 100mbit, 10gbit")
    if not DELAY.match(link.delay):
        raise UsageError(f"--delay {link.delay!r}: write a tc time such as 0.2ms, 50us, 0ms")
    if not 0 <= link.loss < 100:
        raise UsageError(f"--loss {link.loss:g}: a percentage in [0, 100)")
    return link


def free_subnet(name):
    """A /24 of 198.18.0.0/15 for a new cluster: the one its name hashes to
    (stable across runs), else the next one no other cluster holds and no
    route of this machine names. Two names may hash alike; they still get
    two subnets."""
    taken = {c.subnet for c in load_all()}
    routed = set(sh("ip", "route", "show", "table", "all", check=False).stdout.split())
    first = 0 if name == "ringtrain" else zlib.crc32(name.encode()) % 256
    for third in ((first + k) % 256 for k in range(256)):
        subnet = f"{SUPERNET[0]}.{SUPERNET[1]}.{third}.0/24"
        if subnet not in taken and subnet not in routed:
            return subnet
    raise UsageError(f"every /24 of {SUPERNET[0]}.{SUPERNET[1]}.0.0/16 is held by a cluster or a route: "
                     f"take one down (ringtrain-cluster --name NAME down; their names are the folders of {STATE_ROOT})")


# --- building and tearing down -------------------------------------------------

def sh(*argv, check=True):
    """Run one command (an argument list); a failure is one line naming it."""
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise UsageError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")
    return done


_held = 0


@contextlib.contextmanager
def _one_at_a_time():
    """Clusters come and go one at a time on this machine. `down` of the last
    cluster removes what all of them share (the state folder, sshd's
    privilege-separation directory): done while another `up` is half way, it
    took that cluster's files, and its sshd died at start. The lock is on /run
    itself, so that it leaves no file behind."""
    global _held
    if _held:  # (up calls down)
        _held += 1
    else:
        fd = os.open("/run", os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held = 1
    try:
        yield
    finally:
        _held -= 1
        if not _held:
            os.close(fd)  # (closing releases the lock)


def up(name, hosts, link, log=print, slurm=False):
    """Build the cluster (and, with slurm, start SLURM on it: multihost/slurm.py)."""
    with _one_at_a_time():
        return _up(name, hosts, link, log, slurm)


def _up(name, hosts, link, log, slurm):
    check_name(name)
    check_link(link)
    if not 1 <= hosts <= 32:
        raise UsageError(f"--hosts {hosts}: give 1..32")
    check_can_build()
    if slurm:
        slurm_.check_installed()
    if link.needs_netem and not netem_available():
        raise UsageError("this kernel has no netem qdisc (sch_netem), so links can be rate-limited "
                         "(tbf) but not delayed or made lossy: use --delay 0ms --loss 0")
    down(name, quiet=True)  # what a crashed run left behind
    subnet = free_subnet(name)
    prefix = subnet.rsplit(".", 1)[0]
    cluster = Cluster(name, subnet, link,
                      [HostState(f"h{i}", f"{name}-h{i}", f"{prefix}.{i}") for i in range(1, hosts + 1)], slurm)
    os.makedirs(cluster.state_dir, mode=0o700)
    os.makedirs(cluster.session_tmp)
    cluster.save()  # before the route: `down` removes the route the state names, and no other
    # First: nothing sent to this range from the root namespace may take the default route.
    sh("ip", "route", "add", "unreachable", cluster.subnet)
    try:
        _build_network(cluster)
        _write_ssh_files(cluster)
        if slurm:
            slurm_.prepare(cluster)  # (its /etc folders must exist before the sshds bind them)
        for host in cluster.hosts:
            host.sshd_pid = _start_sshd(cluster, host)
            cluster.save()
        _wait_for_ssh(cluster)
        with open(cluster.hostfile, "w") as f:
            f.write("".join(f"{h.name} slots=1\n" for h in cluster.hosts))
        cluster.save()
        log(f"ringtrain-cluster: {name} is up: {hosts} host(s) h1..h{hosts} on {cluster.subnet}, "
            f"{IFACE} links {link.rate}, delay {link.delay}, loss {link.loss:g}%; hostfile {cluster.hostfile}")
        if slurm:
            slurm_.start(cluster, log)
    except BaseException as e:
        kept = _keep_logs(cluster)  # (down removes the state folder they are in)
        down(name, quiet=True)
        if isinstance(e, UsageError) and kept:
            raise UsageError(f"{e} [the cluster's logs are kept in {kept}]") from None
        raise
    return cluster


def _keep_logs(cluster):
    """Copy the logs of a cluster whose `up` failed (sshd's, SLURM's) to
    FAILED_UP_LOGS/NAME, replacing an older copy; returns that folder, or None."""
    kept = os.path.join(FAILED_UP_LOGS, cluster.name)
    shutil.rmtree(kept, ignore_errors=True)
    for folder, _, files in os.walk(cluster.state_dir):
        for name in files:
            if name.endswith((".log", ".out")):
                target = os.path.join(kept, os.path.relpath(folder, cluster.state_dir))
                os.makedirs(target, exist_ok=True)
                shutil.copy(os.path.join(folder, name), target)
    return kept if os.path.isdir(kept) else None


def _build_network(cluster):
    sw = cluster.switch
    sh("ip", "netns", "add", sw)
    sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", sw, "link", "set", "br0", "up")
    for host in cluster.hosts:
        ns = host.netns
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", sw, "link", "add", host.name, "type", "veth", "peer", "name", IFACE, "netns", ns)
        sh("ip", "-n", sw, "link", "set", host.name, "master", "br0", "up")
        sh("ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", IFACE)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", IFACE, "up")
        # Shaped both ways: the host's egress, and the switch's egress towards the host.
        sh("tc", "-n", ns, "qdisc", "add", "dev", IFACE, "root", *cluster.link.qdisc_args())
        sh("tc", "-n", sw, "qdisc", "add", "dev", host.name, "root", *cluster.link.qdisc_args())


def _write_ssh_files(cluster):
    state = cluster.state_dir
    key = os.path.join(state, "id_ed25519")
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ringtrain-cluster {cluster.name}", "-f", key)
    shutil.copy(key + ".pub", os.path.join(state, "authorized_keys"))
    known = []
    for host in cluster.hosts:
        hostdir = os.path.join(state, host.name)
        os.makedirs(hostdir)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(hostdir, "ssh_host_ed25519_key"))
        with open(os.path.join(hostdir, "ssh_host_ed25519_key.pub")) as f:
            known.append(f"{host.name},{host.address} {' '.join(f.read().split()[:2])}\n")
        with open(os.path.join(hostdir, "sshd_config"), "w") as f:
            f.write(_sshd_config(cluster, host, hostdir))
    with open(os.path.join(state, "known_hosts"), "w") as f:
        f.writelines(known)
    names = "".join(f"{h.address} {h.name}\n" for h in cluster.hosts)
    for host in cluster.hosts:
        etc = os.path.join(NETNS_ETC, host.netns)
        os.makedirs(os.path.join(etc, "ssh"), exist_ok=True)
        with open(os.path.join(etc, "hosts"), "w") as f:
            f.write(f"127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n{names}")
        # Bound over /etc/ssh on that host: every ssh client there (mpirun, horovodrun,
        # ps-baseline launch) uses the cluster's key and checks the hosts' keys.
        with open(os.path.join(etc, "ssh", "ssh_config"), "w") as f:
            f.write(f"Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
                    f"  UserKnownHostsFile {os.path.join(state, 'known_hosts')}\n"
                    "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
                    # A dead host sends nothing back, not even a reset: without these, the ssh that
                    # holds mpirun's daemon there waits forever, and so does mpirun.
                    "  ServerAliveInterval 5\n  ServerAliveCountMax 3\n"
                    "")


def _sshd_config(cluster, host, hostdir):
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **host_env(cluster)}
    return (f"ListenAddress {host.address}\nPort 22\n"
            f"HostKey {os.path.join(hostdir, 'ssh_host_ed25519_key')}\n"
            f"AuthorizedKeysFile {os.path.join(cluster.state_dir, 'authorized_keys')}\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile none\n"
            "X11Forwarding no\nPrintMotd no\nLogLevel ERROR\n"
            # launchers open many sessions at once (horovodrun checks every host in parallel)
            "MaxStartups 200\nMaxSessions 200\n"
            # as on a cluster whose shared home activates this install in every shell
            + "".join(f'SetEnv "{k}={v}"\n' for k, v in env.items()))


def _new_hostname(name):
    def preexec():
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.unshare(CLONE_NEWUTS) != 0 or libc.sethostname(name.encode(), len(name)) != 0:
            raise OSError(ctypes.get_errno(), f"cannot give this host the name {name}")
        os.setsid()
    return preexec


def _start_sshd(cluster, host):
    hostdir = os.path.join(cluster.state_dir, host.name)
    if not os.path.isdir(PRIVSEP_DIR):  # sshd's privilege-separation directory: ours to remove
        os.makedirs(PRIVSEP_DIR)
        open(os.path.join(STATE_ROOT, ".made-privsep-dir"), "w").close()
    sshd = shutil.which("sshd", path="/usr/sbin:/sbin:" + os.environ.get("PATH", ""))
    # What `ip netns exec` and sshd say before sshd's own log (-E) opens goes to start.log.
    start_log = os.path.join(hostdir, "start.log")
    with open(os.devnull, "rb") as null, open(start_log, "wb") as early:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, sshd, "-D", "-f", os.path.join(hostdir, "sshd_config"), "-E",
             os.path.join(hostdir, "sshd.log")],
            stdin=null, stdout=early, stderr=early, preexec_fn=_new_hostname(host.name), close_fds=True)
    host.sshd_pid = proc.pid
    # Until `ip netns exec` has exec'd sshd, the child is a copy of this process, then `ip`.
    deadline = time.monotonic() + 30
    while not _runs(proc.pid, sshd):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise UsageError(f"sshd of {host.name} did not start (exit {proc.poll()}): see {start_log}")
        time.sleep(0.02)
    return proc.pid


def _runs(pid, program):
    try:
        return os.readlink(f"/proc/{pid}/exe") == os.path.realpath(program)
    except OSError:
        return False


def _wait_for_ssh(cluster, timeout=30):
    """Every host answers ssh from h1, by name, with the cluster's key."""
    first = cluster.hosts[0]
    deadline = time.monotonic() + timeout
    for host in cluster.hosts:
        while True:
            done = subprocess.run(enter_argv(cluster, first.name, ["ssh", host.name, "true"]),
                                  capture_output=True, text=True)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise UsageError(f"sshd on {host.name} did not answer within {timeout}s: "
                                 f"{done.stderr.strip()} (see {cluster.state_dir}/{host.name}/sshd.log)")
            time.sleep(0.2)


def crash(cluster, host_name):
    """Pull a host's plug: its link goes silent (no reply, not even a reset)
    and every process on it, sshd too, is killed, as in a power failure."""
    host = cluster.host(host_name)
    sh("ip", "-n", cluster.switch, "link", "set", host.name, "down")
    _end_processes(host.netns, signals=(signal.SIGKILL,))


def processes_in(netns):
    """PIDs of every process in the named network namespace."""
    try:
        inode = os.stat(os.path.join("/run/netns", netns)).st_ino
    except OSError:
        return []
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == f"net:[{inode}]":
                pids.append(int(pid))
        except OSError:
            continue
    return pids


def _end_processes(netns, signals=(signal.SIGTERM, signal.SIGKILL)):
    for sig in signals:
        pids = processes_in(netns)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while processes_in(netns) and time.monotonic() < deadline:
            time.sleep(0.1)


def down(name, quiet=False, log=print):
    """Remove every process, namespace, interface, file and route `up` made;
    also what a crashed `up` left (found by name, not only by the state file)."""
    with _one_at_a_time():
        _down(name, quiet, log)


def _down(name, quiet, log):
    check_name(name)
    ours = re.compile(rf"^{re.escape(name)}-(h\d+|sw)$")
    namespaces = [line.split()[0] for line in sh("ip", "netns", "list", check=False).stdout.splitlines()
                  if line.split() and ours.match(line.split()[0])]
    for ns in sorted(namespaces, key=lambda n: n.endswith("-sw")):  # hosts first, the switch last
        _end_processes(ns)
        sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
    for leftover in (os.listdir(NETNS_ETC) if os.path.isdir(NETNS_ETC) else []):
        if ours.match(leftover):
            shutil.rmtree(os.path.join(NETNS_ETC, leftover), ignore_errors=True)
    try:
        subnet = load(name).subnet
    except (UsageError, OSError, ValueError, KeyError, TypeError):
        subnet = None  # (no state: `up` had not added a route)
    shutil.rmtree(os.path.join(STATE_ROOT, name), ignore_errors=True)
    if os.path.isdir(STATE_ROOT) and not [n for n in os.listdir(STATE_ROOT) if not n.startswith(".")]:
        # the last cluster: what `up` made for all of them goes too
        if os.path.exists(os.path.join(STATE_ROOT, ".made-privsep-dir")):
            with contextlib.suppress(OSError):
                os.rmdir(PRIVSEP_DIR)
        shutil.rmtree(STATE_ROOT, ignore_errors=True)
    # Last: the route that kept cluster traffic on this machine (this cluster's, never
    # another's: two names may hash to one subnet).
    if subnet:
        sh("ip", "route", "del", "unreachable", subnet, check=False)
    if not quiet:
        log(f"ringtrain-cluster: {name} is down" + ("" if namespaces else " (nothing was up)"))


def load(name):
    path = os.path.join(STATE_ROOT, check_name(name), "state.json")
    if not os.path.exists(path):
        raise UsageError(f"cluster {name} is not up: ringtrain-cluster up --hosts N"
                         + ("" if name == "ringtrain" else f" --name {name}"))
    with open(path) as f:
        raw = json.load(f)
    return Cluster(raw["name"], raw["subnet"], Link(**raw["link"]), [HostState(**h) for h in raw["hosts"]],
                   raw.get("slurm", False))


def load_all():
    if not os.path.isdir(STATE_ROOT):
        return []
    return [load(n) for n in sorted(os.listdir(STATE_ROOT))
            if os.path.exists(os.path.join(STATE_ROOT, n, "state.json")) and NAME.match(n)]


def status_lines(cluster):
    lines = [f"cluster {cluster.name}: {len(cluster.hosts)} host(s) on {cluster.subnet}, links "
             f"{cluster.link.rate}, delay {cluster.link.delay}, loss {cluster.link.loss:g}%; "
             f"hostfile {cluster.hostfile}"]
    for h in cluster.hosts:
        alive = is_our_sshd(cluster, h)
        lines.append(f"  {h.name}  {h.address:<15} netns {h.netns:<14} sshd "
                     f"{'pid ' + str(h.sshd_pid) if alive else 'DOWN'}  processes {len(processes_in(h.netns))}")
    if cluster.slurm:
        lines += slurm_.status_lines(cluster)
    return lines


def interface_bytes(cluster):
    """{host: (rx bytes, tx bytes)} of each host's eth0, read in the switch
    namespace (where the peer's rx is the host's tx)."""
    out = {}
    for h in cluster.hosts:
        done = sh("ip", "-n", cluster.switch, "-s", "-j", "link", "show", "dev", h.name)
        stats = json.loads(done.stdout)[0]["stats64"]
        out[h.name] = (stats["tx"]["bytes"], stats["rx"]["bytes"])
    return out
