"""In-process handlers the benchmarks load into `seamq consume` subprocesses."""

from seamq.registry import Registry


async def noop(envelope, tx) -> None:
    return None


REGISTRY = Registry(default="bench.handlers:noop")
