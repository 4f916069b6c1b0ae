"""OpenMPI hostfiles (`host slots=N` per line, as `mpirun --hostfile` reads
them), checked so that a bad one is one line naming the file, the line and
the fix, before anything starts."""
import os
import socket
from dataclasses import dataclass

from ringtrain.multihost.procs import HOST_NAME
from ringtrain.common.errors import UsageError


@dataclass
class Host:
    name: str
    slots: int  # ranks (on GPU hosts: GPUs) it takes


def read_hostfile(path, resolve=True):
    """[Host] in file order; a host named twice has its slots added up, as in OpenMPI."""
    if not os.path.isfile(path):
        raise UsageError(f"hostfile {path} does not exist: give an OpenMPI hostfile "
                         "(one `host slots=N` per line)")
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read hostfile {path}: {e}") from None
    hosts = {}
    for number, text in enumerate(lines, start=1):
        words = text.split("#", 1)[0].split()
        if not words:
            continue
        name, slots = _parse_line(path, number, text, words)
        hosts[name] = hosts.get(name, 0) + slots
    if not hosts:
        raise UsageError(f"hostfile {path} names no host: write one `host slots=N` per line")
    if resolve:
        for name in hosts:
            try:
                socket.getaddrinfo(name, None)
            except socket.gaierror:
                raise UsageError(f"hostfile {path}: unknown host {name!r} (it does not resolve here): "
                                 "fix the name, or add it to DNS or /etc/hosts") from None
    return [Host(name, slots) for name, slots in hosts.items()]


def _parse_line(path, number, text, words):
    where = f"hostfile {path} line {number} ({text.strip()!r})"
    name, options = words[0], words[1:]
    if not HOST_NAME.match(name):
        raise UsageError(f"{where}: {name!r} is not a host name; write `host slots=N`")
    slots = 1
    for option in options:
        key, sep, value = option.partition("=")
        if key == "max_slots" and sep:
            continue
        if key != "slots" or not sep or not value.isdigit() or int(value) < 1:
            raise UsageError(f"{where}: expected `{name} slots=N` with N >= 1")
        slots = int(value)
    return name, slots


def fill(hosts, count, path="the hostfile"):
    """The host of each of `count` ranks, filling each host's slots in turn
    (ranks 0..s1-1 on the first host, and so on), as mpirun --map-by slot does."""
    total = sum(h.slots for h in hosts)
    if count > total:
        listed = ", ".join(f"{h.name} slots={h.slots}" for h in hosts)
        raise UsageError(f"{path} has {total} slot(s) ({listed}) but {count} are needed: "
                         "add hosts or slots, or ask for fewer workers")
    placed = []
    for host in hosts:
        placed += [host.name] * min(host.slots, count - len(placed))
    return placed
