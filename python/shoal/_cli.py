"""The `shoal` console script: the Rust command line inside the extension."""

import sys

from shoal import _internal


def main() -> None:
    argv = ["shoal", *sys.argv[1:]]
    sys.exit(_internal.cli_main(argv, [sys.executable, "-m", "shoal"]))


if __name__ == "__main__":
    main()
