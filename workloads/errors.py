"""One error type for bad input: the CLIs print it as one line and exit 2."""


class UsageError(Exception):
    """Bad user input (flag, path, file). The message names it and the fix."""


def first_line(error):
    """The first line of an exception's message (TF's run to dozens), or its type."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def run_cli(prog, main, argv=None):
    """Run main(argv); a UsageError becomes one line on stderr and exit 2."""
    import sys
    try:
        return main(argv)
    except UsageError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
