"""`ringtrain-cluster`: a simulated cluster of network-namespace hosts on
this machine (see multihost/simcluster.py), to run ring, PS and the bench
across hosts as on a real cluster."""
import argparse
import os
import sys

from ringtrain.multihost import simcluster
from ringtrain.common.errors import UsageError, run_cli
from ringtrain.common.parsing import OneLineParser, add_version

EXAMPLES = """examples (as root):
  ringtrain-cluster up --hosts 3 --link-rate 1gbit
  ringtrain-cluster status
  ringtrain-cluster exec h1 -- horovodrun --gloo -H h1:1,h2:1,h3:1 ringtrain --steps 30
  ringtrain-cluster exec h1 -- mpirun --hostfile "$(ringtrain-cluster hostfile)" ringtrain --steps 30
  ringtrain-cluster exec h1 -- ps-baseline launch --hostfile "$(ringtrain-cluster hostfile)" --num-ps 1 --num-workers 3 --sync
  ringtrain-cluster crash h3                    # a dead host, mid-job
  ringtrain-cluster down

  ringtrain-cluster up --hosts 3 --slurm         # and a SLURM: slurmctld on h1, slurmd on each host
  ringtrain-cluster exec h1 -- sbatch --nodes=3 mpi_hostfiles/slurm/ring.sbatch --steps 30

Each host hK has its own network namespace and hostname, an interface eth0
with an address in 198.18.0.0/15 (RFC 2544: never a real network) on a link
shaped both ways with tc (tbf; netem for --delay/--loss), and an sshd on port 22 of that address that
takes only the key generated for this cluster. Hosts share this machine's
files, so the same .venv works on each, as with a shared home directory.
"""


def parser():
    p = OneLineParser(prog="ringtrain-cluster", epilog=EXAMPLES,
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      description="A simulated cluster of hosts h1..hN on this machine.")
    add_version(p)
    p.add_argument("--name", default="ringtrain",
                   help="cluster name, so that several can coexist (default %(default)s)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    u = sub.add_parser("up", help="create the hosts (after removing any left by a crash)")
    u.add_argument("--hosts", type=int, required=True, metavar="N", help="hosts h1..hN (1..32)")
    u.add_argument("--link-rate", default="1gbit", metavar="RATE",
                   help="each host's link, both ways, as tc writes rates (default %(default)s)")
    u.add_argument("--delay", default="0ms", metavar="TIME",
                   help="one-way delay per link, e.g. 0.2ms (default %(default)s; needs the kernel's netem)")
    u.add_argument("--loss", type=float, default=0.0, metavar="PCT",
                   help="packet loss, %% (default 0; needs the kernel's netem)")
    u.add_argument("--slurm", action="store_true",
                   help="also run SLURM on the hosts: munged and slurmd on each, slurmctld on h1 (Debian's "
                        "packages, which `make install` installs); then ringtrain-cluster exec h1 -- sbatch ...")
    sub.add_parser("down", help="remove every namespace, interface, process, file and route of the cluster")
    sub.add_parser("status", help="the hosts, their addresses and sshd; exit 1 if the cluster is not up")
    sub.add_parser("hostfile", help="print the path of an OpenMPI hostfile of the hosts (hK slots=1)")
    c = sub.add_parser("crash", help="pull a host's plug, to see a job survive or end: its link goes silent "
                                     "and every process on it is killed (bring it back with down, then up)")
    c.add_argument("host", help="h1..hN")
    e = sub.add_parser("exec", help="run a command on a host, in the caller's directory, with the caller's PATH")
    e.add_argument("host", help="h1..hN")
    e.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    return p


def _main(argv):
    args = parser().parse_args(argv)
    if args.command == "up":
        simcluster.up(args.name, args.hosts, simcluster.Link(args.link_rate, args.delay, args.loss),
                      slurm=args.slurm)
    elif args.command == "down":
        simcluster.down(args.name)
    elif args.command == "status":
        for line in simcluster.status_lines(simcluster.load(args.name)):
            print(line)
    elif args.command == "crash":
        simcluster.crash(simcluster.load(args.name), args.host)
        print(f"ringtrain-cluster: {args.host} of {args.name} is down: its link is silent and its processes are killed")
    elif args.command == "hostfile":
        print(simcluster.load(args.name).hostfile)
    else:
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            raise UsageError("exec needs a command: ringtrain-cluster exec h1 -- CMD ...")
        target = simcluster.enter_argv(simcluster.load(args.name), args.host, command)
        sys.stdout.flush()
        os.execvp(target[0], target)  # the command's exit status is ours
    return 0


def main(argv=None):
    return run_cli("ringtrain-cluster", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
