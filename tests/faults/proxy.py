"""A small asyncio TCP fault proxy on loopback: cut, delay or drop a link, both ways.

Guarantee: it listens and dials only 127.0.0.0/8 (a request to any other address would leave the
machine, docs/design.md §8); `cut()` closes every open connection and refuses new ones until `heal()`;
`delay` holds every chunk that long in each direction; `drop` silently discards each chunk with that
probability (the peer sees a stalled, then broken, stream — never altered bytes); `stalled` silences
the connections open at the time, both ways and without closing them, while later ones are forwarded
(a peer gone without a TCP reset: a NAT's dropped mapping, a partition); `observe` is shown every
chunk forwarded, by connection and direction ("up" towards the target); `source_host` is the address
it dials from (the target then sees its clients as one peer of that address: another node). The proxies run on
one event loop in a background thread, so the harness can drive them from plain synchronous code.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field


def _loopback(host: str) -> str:
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"{host} is not on 127.0.0.0/8: the fault harness stays on loopback")
    return host


@dataclass
class FaultProxy:
    """Listens on listen_host:port and forwards to target; the fault knobs apply to both ways."""

    name: str
    target_host: str
    target_port: int
    listen_host: str = "127.0.0.1"
    port: int = 0
    delay: float = 0.0
    drop: float = 0.0
    cut_now: bool = False
    stalled: int = 0  # connections numbered below it are silenced
    observe: Callable[[int, str, bytes], None] | None = None
    source_host: str = ""
    rng: random.Random = field(default_factory=random.Random)
    _opened: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    async def start(self) -> None:
        _loopback(self.listen_host), _loopback(self.target_host), _loopback(self.source_host or "127.0.0.1")
        self._server = await asyncio.start_server(self._accept, self.listen_host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_now:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.target_host, self.target_port,
                local_addr=(self.source_host, 0) if self.source_host else None)
        except OSError:
            writer.close()  # the target is down: the client sees a refused stream, as without a proxy
            return
        self._writers |= {writer, up_writer}
        number, self._opened = self._opened, self._opened + 1
        try:
            await asyncio.gather(self._pump(reader, up_writer, number, "up"),
                                 self._pump(up_reader, writer, number, "down"))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int,
                    direction: str) -> None:
        try:
            while chunk := await reader.read(65536):
                if self.cut_now:
                    break
                if number < self.stalled:
                    continue
                if self.delay:
                    await asyncio.sleep(self.delay)
                if self.drop and self.rng.random() < self.drop:
                    continue
                if self.observe is not None:
                    self.observe(number, direction, chunk)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if number >= self.stalled:  # a silenced link passes on no close either
                writer.close()

    def _cut(self) -> None:
        self.cut_now = True
        for w in list(self._writers):
            w.close()

    async def close(self) -> None:
        self._cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class ProxyLoop:
    """The background event loop that owns every proxy of one harness."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fault-proxies", daemon=True)
        self.thread.start()
        self.proxies: list[FaultProxy] = []

    def _call(self, coro) -> object:  # type: ignore[no-untyped-def]
        fut: Future[object] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(10)

    def add(self, name: str, target: str, listen_host: str = "127.0.0.1", port: int = 0,
            seed: int = 0, source_host: str = "") -> FaultProxy:
        host, target_port = target.rsplit(":", 1)
        proxy = FaultProxy(name, host, int(target_port), listen_host, port, source_host=source_host,
                           rng=random.Random(seed))
        self._call(proxy.start())
        self.proxies.append(proxy)
        return proxy

    def cut(self, proxy: FaultProxy) -> None:
        self.loop.call_soon_threadsafe(proxy._cut)

    def heal(self, proxy: FaultProxy) -> None:
        def heal() -> None:
            proxy.cut_now, proxy.delay, proxy.drop = False, 0.0, 0.0
        self.loop.call_soon_threadsafe(heal)

    def stall(self, proxy: FaultProxy) -> None:
        def stall() -> None:
            proxy.stalled = proxy._opened
        self.loop.call_soon_threadsafe(stall)

    def degrade(self, proxy: FaultProxy, delay: float = 0.0, drop: float = 0.0) -> None:
        def degrade() -> None:
            proxy.delay, proxy.drop = delay, drop
        self.loop.call_soon_threadsafe(degrade)

    def close(self) -> None:
        for proxy in self.proxies:
            self._call(proxy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
