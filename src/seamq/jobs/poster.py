"""An HTTP POST for webhook deliveries (seamq.jobs.ports.Post), on one aiohttp session: redirects
followed (3 at most), the answer's body read and dropped, no cookie kept between receivers.

A subscription's URL is anyone's to choose, so by default no delivery goes to an address inside the
server's own networks (loopback, private, link-local such as a cloud's metadata service, or any
other address that is not global), whatever its name resolves to and wherever a redirect points:
the addresses are checked as resolved, and the connection is made to those checked.
`SEAMQ_JOBS__WEBHOOK_PRIVATE_ADDRESSES=true` allows them, for receivers inside your network.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import aiohttp
import yarl
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from seamq.model import describe

REDIRECTS = 3


class PublicOnly(AbstractResolver):
    """A resolver that refuses a name with any address that is not global (OSError, which the delivery
    records as its error, and retries by the schedule: an operator may allow it meanwhile)."""

    def __init__(self) -> None:
        self.inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[Any]:
        found = await self.inner.resolve(host, port, family)
        for each in found:
            address = ipaddress.ip_address(each["host"])
            if not address.is_global:
                raise OSError(f"refused: {host} is at {address}, an address inside this network (set "
                              "SEAMQ_JOBS__WEBHOOK_PRIVATE_ADDRESSES=true for receivers inside it)")
        return found

    async def close(self) -> None:
        await self.inner.close()


class Poster:
    def __init__(self, *, private_addresses: bool = False) -> None:
        self._session: aiohttp.ClientSession | None = None
        self.private_addresses = private_addresses

    async def __call__(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str | None]:
        if self._session is None:
            connector = aiohttp.TCPConnector(resolver=None if self.private_addresses else PublicOnly())
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), connector=connector)
        try:
            async with asyncio.timeout(timeout):
                for _ in range(1 + REDIRECTS):  # followed here, each target checked as the first was
                    if not self.private_addresses and (why := await _refused(url)):
                        return None, why
                    async with self._session.post(url, data=body, headers=headers, allow_redirects=False) as answer:
                        await answer.read()
                        target = answer.headers.get("Location") if answer.status in (301, 302, 303, 307, 308) else None
                        if target is None:
                            return answer.status, None
                        url = str(answer.url.join(yarl.URL(target)))
                return None, f"more than {REDIRECTS} redirects"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            return None, describe(exc)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _refused(url: str) -> str | None:
    """Why a delivery may not go to `url` (an address inside this network), None when it may."""
    host = yarl.URL(url).host or ""
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        found = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        addresses = [ipaddress.ip_address(info[4][0]) for info in found]
    inside = next((a for a in addresses if not a.is_global), None)
    where = host if str(inside) == host else f"{host} ({inside})"
    return None if inside is None else f"refused: {where} is an address inside this network (set " \
        "SEAMQ_JOBS__WEBHOOK_PRIVATE_ADDRESSES=true for receivers inside it)"
