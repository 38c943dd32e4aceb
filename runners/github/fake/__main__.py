"""`python -m runners.github.fake`: the fake GitHub in the foreground, without Django."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from runners.github.fake.cli import add_arguments, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.github.fake", description=__doc__)
    add_arguments(parser)
    options = vars(parser.parse_args(argv))
    return serve(options, out=partial(print, flush=True))


if __name__ == "__main__":
    sys.exit(main())
