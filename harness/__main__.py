"""`python -m harness` and the `va-bench` command: the CLI, started so that a Ctrl-C while it imports (before its
signal handlers exist) is one line, not a traceback."""

import sys


def main() -> None:
    """Import the CLI and run it (`harness.cli.entry`)."""
    try:
        from harness.cli import entry
    except KeyboardInterrupt:
        sys.stderr.write("interrupted while starting; nothing was run\n")
        raise SystemExit(130) from None
    entry()


if __name__ == "__main__":
    main()
