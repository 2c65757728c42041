"""seamq.http.wire, the consumer's HTTP/1.1 client, against a scripted server on 127.0.0.1: each test's
server answers with the bytes it is given, so the answers a real server might send (closing,
chunked, 1xx first, too big, not HTTP, nothing) are each tried."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess

import pytest

from seamq.http.wire import MAX_ANSWER, HandlerClient, Target, Unreachable

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Scripted:
    """Reads each request whole (head and Content-Length body) and answers with `answer(request)`:
    bytes to send, with None meaning close without a word; counts connections and requests."""

    def __init__(self, answer=lambda request: OK, close_after: bool = False, delay: float = 0.0) -> None:
        self.answer, self.close_after, self.delay = answer, close_after, delay
        self.connections = self.requests = self.open = self.most_open = 0
        self.seen: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                request = head + await reader.readexactly(length)
                self.requests += 1
                self.seen.append(request)
                if self.delay:
                    await asyncio.sleep(self.delay)
                answer = self.answer(request)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


@contextlib.asynccontextmanager
async def serving(script: Scripted, tls: ssl.SSLContext | None = None):
    server = await asyncio.start_server(script.serve, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def client(**kwargs):
    handler_client = HandlerClient(**kwargs)
    try:
        yield handler_client
    finally:
        await handler_client.close()


async def closed_while_idle(handler_client: HandlerClient) -> None:
    """Until the client has seen the server close its idle connection (an event, not a time)."""
    async with asyncio.timeout(30):
        while any(conn.usable for pool in handler_client._pools.values() for conn in pool.idle):
            await asyncio.sleep(0.001)


async def post(handler_client: HandlerClient, port: int, timeout: float = 10.0, body: bytes = b"{}",
               headers: dict | None = None) -> tuple[int, bytes]:
    return await handler_client.post(Target(f"http://127.0.0.1:{port}/handle"), body,
                                     headers or {"content-type": "application/json"}, timeout)


async def test_the_request_on_the_wire_and_one_connection_kept_for_calls_one_after_another():
    script = Scripted()
    async with serving(script) as port, client() as c:
        for _ in range(3):
            assert await post(c, port, body=b'{"a":1}', headers={"content-type": "application/json", "x-k": "v"}) \
                == (200, b"ok")
    assert script.connections == 1 and script.requests == 3
    assert script.seen[0] == (b"POST /handle HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUser-Agent: seamq\r\n"
                              b"content-type: application/json\r\nx-k: v\r\nContent-Length: 7\r\n\r\n{\"a\":1}" % port)


async def test_calls_in_flight_take_a_connection_each_up_to_the_limit_and_wait_for_one_beyond():
    script = Scripted(delay=0.05)
    async with serving(script) as port, client(limit=3) as c:
        answers = await asyncio.gather(*(post(c, port) for _ in range(12)))
    assert answers == [(200, b"ok")] * 12
    assert script.most_open == 3 and script.connections == 3 and script.requests == 12


async def test_a_connection_idle_longer_than_the_client_keeps_one_is_not_used_again():
    script = Scripted()
    async with serving(script) as port, client(idle=0.05) as c:
        await post(c, port)
        await asyncio.sleep(0.2)
        await post(c, port)
    assert script.connections == 2


async def test_a_server_that_closes_after_answering_or_while_idle_costs_no_call():
    for close_after, answer in ((True, OK), (False, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2"
                                                   b"\r\n\r\nok")):
        script = Scripted(lambda request, answer=answer: answer, close_after=close_after)
        async with serving(script) as port, client() as c:
            for _ in range(3):
                assert await post(c, port) == (200, b"ok")
                await closed_while_idle(c)
        assert script.connections == 3


async def test_answers_chunked_after_a_1xx_or_running_to_the_close_are_read_whole():
    answers = {
        b"HTTP/1.1 422 Unprocessable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbad \r\n5\r\ninput\r\n0\r\n\r\n":
            (422, b"bad input"),
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK: (200, b"ok"),
        b"HTTP/1.0 500 Oops\r\n\r\nno length": (500, b"no length"),
    }
    for answer, read in answers.items():
        async with serving(Scripted(lambda request, answer=answer: answer, close_after=True)) as port, client() as c:
            assert await post(c, port) == read


async def test_a_huge_answer_is_kept_to_its_first_bytes_and_the_connection_stays_good():
    big = b"x" * (10 * MAX_ANSWER)
    script = Scripted(lambda request: b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)
                      if b"big" in request else OK)
    async with serving(script) as port, client() as c:
        status, body = await post(c, port, body=b'"big"')
        assert (status, body) == (500, big[:MAX_ANSWER])
        assert await post(c, port) == (200, b"ok")
    assert script.connections == 1


@pytest.mark.parametrize("answer, error", [
    (None, "closed the connection"), (b"SSH-2.0-OpenSSH_9.6\r\n", "not HTTP"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n", "closed the connection"),
])
async def test_no_answer_or_not_http_is_unreachable_and_the_next_call_gets_a_new_connection(answer, error):
    script = Scripted(lambda request: answer if request.endswith(b"bad") else OK, close_after=answer is not None)
    async with serving(script) as port, client() as c:
        with pytest.raises(Unreachable, match=error):
            await post(c, port, body=b"bad")
        assert await post(c, port) == (200, b"ok")
    assert script.connections == 2


async def test_no_server_is_an_os_error_and_a_silent_one_a_timeout_whose_connection_is_dropped():
    async with client() as c:
        with pytest.raises(OSError):
            await post(c, 1)
    script = Scripted(lambda request: OK if request.endswith(b"quick") else b"")  # b"": silence, kept open
    async with serving(script) as port, client() as c:
        with pytest.raises(TimeoutError):
            await post(c, port, timeout=0.2, body=b"slow")
        assert await post(c, port, body=b"quick") == (200, b"ok")
    assert script.connections == 2


async def test_https_with_the_systems_trust_store(tmp_path, monkeypatch):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    async with serving(Scripted(), tls) as port:
        async with client() as c:  # a certificate nobody vouches for is refused
            with pytest.raises(ssl.SSLCertVerificationError):
                await c.post(Target(f"https://127.0.0.1:{port}/handle"), b"{}", {}, 10)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # now the system trusts it
        async with client() as c:
            assert await c.post(Target(f"https://127.0.0.1:{port}/handle"), b"{}", {}, 10) == (200, b"ok")


def test_a_target_is_an_http_url_with_a_host():
    assert Target("http://[::1]:8080/h?x=1").head.startswith(b"POST /h?x=1 HTTP/1.1\r\nHost: [::1]:8080\r\n")
    assert Target("https://handlers.example/").head.startswith(b"POST / HTTP/1.1\r\nHost: handlers.example\r\n")
    assert Target("http://bücher.example/h é?q=ü").head.startswith(
        b"POST /h%20%C3%A9?q=%C3%BC HTTP/1.1\r\nHost: xn--bcher-kva.example\r\n")
    assert b"\r\nAuthorization: Basic dTpwIHc=\r\n" in Target("http://u:p%20w@127.0.0.1:9/h").head  # u:p w
    for bad in ("ftp://x/handle", "http:///handle", "handlers:8080/handle"):
        with pytest.raises(ValueError, match="not an http"):
            Target(bad)
