"""`python -m scheduler`: the same command as `warmpool scheduler`, with its one-line errors."""

import sys

from warmpool.cli.main import main

main(["scheduler", *sys.argv[1:]], prog_name="python -m")
