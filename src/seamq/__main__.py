"""`python -m seamq` and the `seamq` command.

The command needs the worker extra (typer, rich, nats-py, psycopg, ...); a producer's install of
seamq alone does not have it, and is told so instead of shown an ImportError.
"""

import sys


def main() -> None:
    try:
        from seamq.cli import main as command
    except ModuleNotFoundError as exc:
        sys.stderr.write(f"error[INVALID_CONFIG]: the seamq command needs the worker extra ({exc.name} is not "
                         "installed): pip install 'seamq[worker]'\n")
        sys.exit(2)
    command()


if __name__ == "__main__":
    main()
