"""An HTTP POST for webhook deliveries (seamq.jobs.ports.Post), on one aiohttp session: redirects
followed (3 at most), the answer's body read and dropped, no cookie kept between receivers."""

from __future__ import annotations

import asyncio

import aiohttp

from seamq.model import describe


class Poster:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str | None]:
        if self._session is None:
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        try:
            async with self._session.post(url, data=body, headers=headers, max_redirects=3,
                                          timeout=aiohttp.ClientTimeout(total=timeout)) as answer:
                await answer.read()
                return answer.status, None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return None, describe(exc)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
