"""A simulated host is a network namespace anchored by its own sshd: where
its /etc lives, and how a command enters it. Shared by the simulated cluster
(simcluster) and the SLURM it runs (slurm)."""
import os

from ringtrain.common.errors import UsageError

# `ip netns exec NS` binds /etc/netns/NS/* over /etc: each host's hosts file, ssh and SLURM config.
NETNS_ETC = "/etc/netns"


def enter_argv(cluster, host_name, argv, cwd=None):
    """The command that runs argv on a host: in its sshd's network, UTS and
    mount namespaces (hence its hostname, /etc/hosts and ssh config), in cwd."""
    host = cluster.host(host_name)
    if not host.sshd_pid or not is_our_sshd(cluster, host):
        raise UsageError(f"{host_name} of cluster {cluster.name} is down (its sshd is gone): "
                         "ringtrain-cluster down, then up")
    return ["nsenter", f"--target={host.sshd_pid}", "--net", "--uts", "--mount",
            f"--wd={cwd or os.getcwd()}", "--", "env", *(f"{k}={v}" for k, v in host_env(cluster).items()), *argv]


def host_env(cluster):
    """What every command on a host has in its environment, entered or over ssh."""
    return {"OMPI_MCA_orte_tmpdir_base": cluster.session_tmp}


def is_our_sshd(cluster, host):
    """Whether the host's recorded sshd PID is still its sshd (not a reused PID)."""
    try:
        with open(f"/proc/{host.sshd_pid}/cmdline", "rb") as f:
            return os.path.join(cluster.state_dir, host.name, "sshd_config").encode() in f.read()
    except OSError:
        return False
