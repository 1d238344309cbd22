"""A fault-injecting TCP proxy that speaks Kafka framing, for chaos tests of clients against kbroker.

    with ChaosProxy(broker.port, listen_port=proxy_port, seed=7, drop_response=10, cut_before_request=10,
                    cut_after_request=10) as proxy:
        ...  # clients connect to 127.0.0.1:proxy_port
    assert proxy.stats.faults >= 20

Clients learn broker addresses from Metadata, so the broker must advertise the proxy
(`advertised.listeners=PLAINTEXT://127.0.0.1:<proxy port>`, listeners staying on the broker's own port) or
the clients leave the proxy after their first Metadata response.

Every frame (4-byte big-endian size + body) is read whole in both directions. Requests are matched with
their responses by correlation id (request header: api_key, api_version, correlation_id; response header:
correlation_id), so responses that never come (Produce with acks=0) do not confuse the bookkeeping.
Faults, each decided per eligible request by a seeded RNG and bounded by a per-kind budget:

  drop_response       forward the request, read its response from the broker, do not forward it, then close
                      the client connection (and the broker one): the broker did the work, the client never
                      learns it.
  cut_before_request  close both connections instead of forwarding a request: the broker never sees it.
  cut_after_request   forward the request and close both connections at once, before its response: the broker
                      may or may not have handled it.

Only requests of `fault_api_keys` (default: Produce) are eligible, after `warmup_requests` eligible requests
have passed unharmed; at least `min_gap` eligible requests pass between two faults.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

FAULT_KINDS = ("drop_response", "cut_before_request", "cut_after_request")


@dataclass
class ProxyStats:
    connections: int = 0
    requests: int = 0  # requests forwarded to the broker
    responses: int = 0  # responses forwarded to the client
    drop_response: int = 0
    cut_before_request: int = 0
    cut_after_request: int = 0
    by_api_key: dict[int, int] = field(default_factory=dict)  # forwarded requests per api key

    @property
    def faults(self) -> int:
        return self.drop_response + self.cut_before_request + self.cut_after_request


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """n bytes, or None on EOF/reset/closed socket."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv_frame(sock: socket.socket) -> bytes | None:
    """One whole Kafka frame including its size prefix, or None when the connection ended."""
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    if size < 0:
        return None
    body = _recv_exact(sock, size)
    if body is None:
        return None
    return head + body


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Conn:
    """One client connection and its broker connection, pumped by two threads."""

    def __init__(self, proxy: ChaosProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.drop_cids: set[int] = set()
        self.lock = threading.Lock()
        self.closed = False
        self.threads = [
            threading.Thread(target=self._requests, name="chaos-proxy-c2b", daemon=True),
            threading.Thread(target=self._responses, name="chaos-proxy-b2c", daemon=True),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        _close(self.client)
        _close(self.upstream)
        self.proxy._forget(self)

    def _requests(self) -> None:
        try:
            while True:
                frame = _recv_frame(self.client)
                if frame is None or len(frame) < 12:
                    return
                api_key, _version, cid = struct.unpack(">hhi", frame[4:12])
                fault = self.proxy._decide(api_key)
                if fault == "cut_before_request":
                    return
                if fault == "drop_response":
                    with self.lock:
                        self.drop_cids.add(cid)
                try:
                    self.upstream.sendall(frame)
                except OSError:
                    return
                self.proxy._count_request(api_key)
                if fault == "cut_after_request":
                    return
        finally:
            self.close()

    def _responses(self) -> None:
        try:
            while True:
                frame = _recv_frame(self.upstream)
                if frame is None or len(frame) < 8:
                    return
                (cid,) = struct.unpack(">i", frame[4:8])
                with self.lock:
                    drop = cid in self.drop_cids
                    self.drop_cids.discard(cid)
                if drop:
                    self.proxy._count_dropped()
                    return  # read from the broker, never forwarded; close() cuts the client off
                try:
                    self.client.sendall(frame)
                except OSError:
                    return
                self.proxy._count_response()
        finally:
            self.close()


class ChaosProxy:
    """127.0.0.1:<listen_port> -> 127.0.0.1:<target_port>, with seeded, bounded fault injection."""

    def __init__(self, target_port: int, listen_port: int = 0, *, seed: int = 0, probability: float = 0.05,
                 drop_response: int = 0, cut_before_request: int = 0, cut_after_request: int = 0,
                 fault_api_keys: Iterable[int] = (0,), warmup_requests: int = 5, min_gap: int = 3,
                 target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.rng = random.Random(seed)
        self.probability = probability
        self.budget = {"drop_response": drop_response, "cut_before_request": cut_before_request,
                       "cut_after_request": cut_after_request}
        self.fault_api_keys = frozenset(fault_api_keys)
        self.warmup_requests = warmup_requests
        self.min_gap = min_gap
        self.stats = ProxyStats()
        self.enabled = True  # faults on; set False to let everything through
        self._lock = threading.Lock()
        self._eligible_seen = 0
        self._since_fault = min_gap
        self._conns: set[_Conn] = set()
        self._stopping = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", listen_port))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name="chaos-proxy-accept", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> ChaosProxy:
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        _close(self._listener)
        # wake accept() in case shutdown on a listening socket did not
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
        except OSError:
            pass
        self._accept_thread.join(5)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close()
        for c in conns:
            for t in c.threads:
                t.join(5)

    def __enter__(self) -> ChaosProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def remaining_budget(self) -> int:
        with self._lock:
            return sum(self.budget.values())

    # ------------------------------------------------------------ internals

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._stopping:
                _close(client)
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(self, client, upstream)
            with self._lock:
                self._conns.add(conn)
                self.stats.connections += 1
            conn.start()

    def _forget(self, conn: _Conn) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _decide(self, api_key: int) -> str | None:
        if api_key not in self.fault_api_keys:
            return None
        with self._lock:
            self._eligible_seen += 1
            self._since_fault += 1
            if not self.enabled or self._eligible_seen <= self.warmup_requests or self._since_fault <= self.min_gap:
                return None
            kinds = [k for k in FAULT_KINDS if self.budget[k] > 0]
            if not kinds or self.rng.random() >= self.probability:
                return None
            kind = self.rng.choice(kinds)
            self.budget[kind] -= 1
            if kind != "drop_response":  # counted when the response is really read and dropped
                setattr(self.stats, kind, getattr(self.stats, kind) + 1)
            self._since_fault = 0
            return kind

    def _count_request(self, api_key: int) -> None:
        with self._lock:
            self.stats.requests += 1
            self.stats.by_api_key[api_key] = self.stats.by_api_key.get(api_key, 0) + 1

    def _count_dropped(self) -> None:
        with self._lock:
            self.stats.drop_response += 1

    def _count_response(self) -> None:
        with self._lock:
            self.stats.responses += 1
