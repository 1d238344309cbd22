"""A recording TCP proxy between a real client and Apache Kafka: keeps every request frame with Kafka's answer and
rewrites the advertised host and port in Metadata and FindCoordinator answers so the client stays on the proxy."""

from __future__ import annotations

import asyncio
import struct
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from kbroker.protocol import codec

METADATA, FIND_COORDINATOR, PRODUCE, API_VERSIONS = 3, 10, 0, 18
UNDECODABLE = "<undecodable answer>"


def decode_answer(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, body) of an answer frame. ApiVersions refusing the version asked (UNSUPPORTED_VERSION, which
    kafka-python meets asking a newer version than Kafka 3.9's) answers in v0, as every broker and client reads it."""
    if api_key == API_VERSIONS and len(frame) >= 6 and struct.unpack_from(">h", frame, 4)[0] != 0:
        version = 0
    return codec.decode_response(api_key, version, frame)


@dataclass
class Exchange:
    """One request as the client sent it, on which connection, and Kafka's decoded answer (None: none expected)."""

    connection: int
    api_key: int
    version: int
    frame: bytes  # without the size prefix
    answer: Any = None
    expects_answer: bool = True
    session: str = ""  # the recorded session that sent it


def _expects_answer(api_key: int, version: int, frame: bytes) -> bool:
    if api_key != PRODUCE:
        return True
    _, pos = codec.decode_request_header(frame)
    body, _ = codec.decode(codec.REQUESTS[PRODUCE], version, frame, pos)
    return body.acks != 0


class RecordingProxy:
    """Listens on 127.0.0.1 (an ephemeral port) in a thread of its own and forwards to one upstream broker."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.exchanges: list[Exchange] = []
        self.port = 0
        self._connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._connections += 1
        connection = self._connections
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        pending: deque[Exchange] = deque()
        answers = asyncio.create_task(self._answers(up_r, client_w, pending))
        try:
            while True:
                size = struct.unpack(">i", await client_r.readexactly(4))[0]
                frame = await client_r.readexactly(size)
                api_key, version = struct.unpack_from(">hh", frame, 0)
                ex = Exchange(
                    connection,
                    api_key,
                    version,
                    frame,
                    expects_answer=_expects_answer(api_key, version, frame),
                )
                self.exchanges.append(ex)
                if ex.expects_answer:
                    pending.append(ex)
                up_w.write(struct.pack(">i", size) + frame)
                await up_w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            answers.cancel()
            up_w.close()
            client_w.close()

    async def _answers(
        self, up_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, pending: deque[Exchange]
    ) -> None:
        try:
            while True:
                size = struct.unpack(">i", await up_r.readexactly(4))[0]
                frame = await up_r.readexactly(size)
                ex = pending.popleft()  # Kafka answers a connection's requests in order
                try:
                    cid, ex.answer = decode_answer(ex.api_key, ex.version, frame)
                except Exception:  # noqa: BLE001 - forwarded as it came; the replay shows it undecodable
                    cid, ex.answer = 0, UNDECODABLE
                if ex.api_key in (METADATA, FIND_COORDINATOR) and ex.answer is not UNDECODABLE:
                    self._advertise_proxy(ex.answer)
                    out = codec.encode_response(cid, ex.api_key, ex.version, ex.answer)
                else:
                    out = struct.pack(">i", size) + frame
                client_w.write(bytes(out))
                await client_w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError, IndexError):
            client_w.close()

    def _advertise_proxy(self, answer: Any) -> None:
        """Point every advertised broker at the proxy (one upstream broker, so one listener suffices). The recorded
        answer keeps Kafka's port only as a normalised field, so rewriting it in place changes nothing compared."""
        nodes = list(getattr(answer, "brokers", None) or []) + list(
            getattr(answer, "coordinators", None) or []
        )
        if getattr(answer, "host", None):
            nodes.append(answer)
        for node in nodes:
            if getattr(node, "host", None):
                node.host = "127.0.0.1"
                node.port = self.port
