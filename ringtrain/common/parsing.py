"""How every ringtrain command reads its flags: argparse, with a bad flag
as one line on stderr and exit status 2, and the number types its flags
take."""
import argparse
import math
import sys


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr and exit status 2.
    `settle(namespace)`: a subclass's hook to settle flags that depend on each
    other once they are parsed (raises UsageError)."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)

    def parse_known_args(self, args=None, namespace=None):
        from ringtrain.common.errors import UsageError
        namespace, extras = super().parse_known_args(args, namespace)
        try:
            self.settle(namespace)
        except UsageError as e:
            self.error(str(e))
        return namespace, extras

    def settle(self, namespace):
        pass


def add_version(parser):
    """--version: the command's name and ringtrain's version."""
    from ringtrain.common.version import __version__
    parser.add_argument("--version", action="version", version=f"{parser.prog.split()[0]} {__version__}",
                        help="print the version and exit")


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def finite_float(text):
    """A float flag: inf and nan are never a setting someone means."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text):
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text):
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value
