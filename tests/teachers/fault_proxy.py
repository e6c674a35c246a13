"""A loopback HTTP/1.1 fault-injection proxy for teacher-client tests (asyncio, one file).

It sits between the client and a real server and, per request (chosen by a seeded RNG with
probability `fault_rate`), does one of:
- drop:  close the connection without answering;
- reset: forward the request, then abort the connection mid-answer (TCP RST);
- error: answer 503 (or 500/429) itself, without forwarding;
- delay: forward after `delay` seconds (a slow but successful answer);
- stall: hold the request longer than the client's per-attempt timeout, then close.
Requests without a fault are forwarded unchanged over a fresh upstream connection. It
understands just enough HTTP (Content-Length bodies, no chunked requests) for the aiohttp
client and uvicorn server used here.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections import Counter
from dataclasses import dataclass, field

FAULTS = ("drop", "reset", "error", "delay", "stall")


async def _read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """(head, body) of one HTTP message, None at EOF. Bodies: Content-Length or chunked."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length, chunked = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return head, await reader.readexactly(length)
    body = b""
    while True:
        size_line = await reader.readuntil(b"\r\n")
        body += size_line
        size = int(size_line.split(b";")[0], 16)
        body += await reader.readexactly(size + 2)
        if size == 0:
            return head, body


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class FaultProxy:
    upstream_host: str
    upstream_port: int
    fault_rate: float = 0.0
    faults: tuple[str, ...] = FAULTS
    delay: float = 0.3
    stall: float = 3.0
    seed: int = 0
    counts: Counter = field(default_factory=Counter)
    _server: asyncio.Server | None = None
    _clients: set = field(default_factory=set)
    port: int = 0

    async def start(self) -> FaultProxy:
        self._rng = random.Random(self.seed)
        # A restart binds the port of the first start: the teacher comes back at the same address.
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._clients):
                w.transport.abort()
            await self._server.wait_closed()
            self._server = None

    def _choose(self) -> str:
        if self._rng.random() < self.fault_rate:
            return self._rng.choice(self.faults)
        return "ok"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        try:
            while (msg := await _read_message(reader)) is not None:
                fault = self._choose()
                self.counts[fault] += 1
                if fault == "drop":
                    writer.close()
                    return
                if fault == "error":
                    status = self._rng.choice(
                        [b"503 Service Unavailable", b"500 Internal Server Error", b"429 Too Many Requests"]
                    )
                    writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 7\r\n\r\nfailure")
                    await writer.drain()
                    continue
                if fault == "stall":
                    await asyncio.sleep(self.stall)
                    writer.close()
                    return
                if fault == "delay":
                    await asyncio.sleep(self.delay)
                answer = await self._forward(*msg)
                if fault == "reset":
                    writer.write(answer[: len(answer) // 2])
                    await writer.drain()
                    _abort(writer)
                    return
                writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._clients.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _forward(self, head: bytes, body: bytes) -> bytes:
        up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        try:
            # one request per upstream connection keeps the framing trivial
            lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
            head = b"\r\n".join(lines[:-2]) + b"\r\nconnection: close\r\n\r\n"
            up_writer.write(head + body)
            await up_writer.drain()
            msg = await _read_message(up_reader)
            if msg is None:
                raise ConnectionError("upstream closed")
            a_head, a_body = msg
            lines = [ln for ln in a_head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
            return b"\r\n".join(lines[:-2]) + b"\r\nconnection: keep-alive\r\n\r\n" + a_body
        finally:
            up_writer.close()
