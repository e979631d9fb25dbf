"""The `shoal` console script: the Rust command line inside the extension.

An extension built without its `cli` feature (the binding alone: client and
contract, no daemon) runs the `shoal` binary named by $SHOAL_BIN instead.
"""

import os
import sys

from shoal import _internal


def main() -> None:
    argv = ["shoal", *sys.argv[1:]]
    cli_main = getattr(_internal, "cli_main", None)
    if cli_main is not None:
        sys.exit(cli_main(argv, [sys.executable, "-m", "shoal"]))
    binary = os.environ.get("SHOAL_BIN")
    if not binary:
        sys.exit(
            "shoal: this build of the shoal package has no command line inside "
            "(its extension was built without the `cli` feature); set SHOAL_BIN to a "
            "`shoal` binary (cargo build --release -p shoal-cli)"
        )
    os.execv(binary, [binary, *argv[1:]])


if __name__ == "__main__":
    main()
