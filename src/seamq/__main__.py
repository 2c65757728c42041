"""`python -m seamq` is the `seamq` command."""

from seamq.cli import main

main()
