"""TCP proxies that cut a broker off from the other brokers or from ZooKeeper, for replication chaos tests.

Each broker advertises its inter-broker listener at a `BrokerLinkProxy` (advertised.listeners INTERNAL://<proxy>),
so every request one broker sends another (replica fetches, LeaderAndIsr, AlterPartition, ...) crosses the
proxy in front of the receiving broker. The proxy learns who is calling from the first request's client id
(`kbroker-broker-<id>`, broker/inter_broker.py); `NetSplit.isolate(b)` closes every connection from or to broker
b and refuses new ones (accepted, first frame read, closed) until `heal()`.

`ZooKeeperProxy` sits between one broker and ZooKeeper (zookeeper.connect=<proxy>): `cut()` closes the
connections and refuses new ones, so the broker's session expires on the server after its timeout; `heal()`
lets it reconnect.
"""

from __future__ import annotations

import socket
import struct
import threading

_CLIENT_PREFIX = b"kbroker-broker-"


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _pump(src: socket.socket, dst: socket.socket, done: threading.Event) -> None:
    try:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            try:
                dst.sendall(data)
            except OSError:
                return
    finally:
        done.set()
        _close(src)
        _close(dst)


class _Proxy:
    """127.0.0.1:<port> -> 127.0.0.1:<target_port>; subclasses decide which connections pass."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self._lock = threading.Lock()
        self._conns: dict[tuple[socket.socket, socket.socket], int | None] = {}
        self._stopping = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self.refused = 0
        threading.Thread(target=self._accept_loop, name=f"proxy-{self.port}", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._stopping:
                _close(client)
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _first_bytes(self, client: socket.socket) -> tuple[bytes, int | None] | None:
        """Bytes read before deciding (forwarded first) and the caller's broker id if known; None: refuse."""
        return b"", None

    def _allowed(self, source: int | None) -> bool:
        raise NotImplementedError

    def _serve(self, client: socket.socket) -> None:
        first = self._first_bytes(client)
        if first is None or not self._allowed(first[1]):
            with self._lock:
                self.refused += 1
            _close(client)
            return
        head, source = first
        try:
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            if head:
                upstream.sendall(head)
        except OSError:
            _close(client)
            return
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._stopping or not self._allowed(source):
                _close(client)
                _close(upstream)
                return
            self._conns[(client, upstream)] = source
        done = threading.Event()
        threading.Thread(target=_pump, args=(upstream, client, done), daemon=True).start()
        _pump(client, upstream, done)
        with self._lock:
            self._conns.pop((client, upstream), None)

    def cut_connections(self) -> int:
        """Close the open connections that are no longer allowed; how many."""
        with self._lock:
            doomed = [pair for pair, source in self._conns.items() if not self._allowed(source)]
        for client, upstream in doomed:
            _close(client)
            _close(upstream)
        return len(doomed)

    def stop(self) -> None:
        self._stopping = True
        _close(self._listener)
        with self._lock:
            pairs = list(self._conns)
        for client, upstream in pairs:
            _close(client)
            _close(upstream)


class NetSplit:
    """Which broker (if any) is cut off from the others; shared by the BrokerLinkProxy of every broker."""

    def __init__(self) -> None:
        self.isolated: int | None = None
        self.proxies: list[BrokerLinkProxy] = []

    def blocked(self, source: int | None, target: int) -> bool:
        iso = self.isolated
        return iso is not None and source != target and iso in (source, target)

    def isolate(self, broker_id: int) -> None:
        self.isolated = broker_id
        for p in self.proxies:
            p.cut_connections()

    def heal(self) -> None:
        self.isolated = None


class BrokerLinkProxy(_Proxy):
    """In front of broker `broker_id`'s inter-broker listener; obeys `split`."""

    def __init__(self, broker_id: int, target_port: int, split: NetSplit) -> None:
        self.broker_id = broker_id
        self.split = split
        super().__init__(target_port)
        split.proxies.append(self)

    def _first_bytes(self, client: socket.socket) -> tuple[bytes, int | None] | None:
        # Request header v1+: size, api_key, api_version, correlation_id, client_id (int16 length + bytes).
        head = _recv_exact(client, 14)
        if head is None:
            return None
        (size,) = struct.unpack_from(">i", head, 0)
        (id_len,) = struct.unpack_from(">h", head, 12)
        if size < 10 or id_len < 0 or id_len > size - 10:
            return head, None
        client_id = _recv_exact(client, id_len)
        if client_id is None:
            return None
        source = None
        if client_id.startswith(_CLIENT_PREFIX) and client_id[len(_CLIENT_PREFIX):].isdigit():
            source = int(client_id[len(_CLIENT_PREFIX):])
        return head + client_id, source

    def _allowed(self, source: int | None) -> bool:
        return not self.split.blocked(source, self.broker_id)


class ZooKeeperProxy(_Proxy):
    """Between one broker and ZooKeeper."""

    def __init__(self, zk_port: int) -> None:
        self.is_cut = False
        super().__init__(zk_port)

    def _allowed(self, source: int | None) -> bool:
        return not self.is_cut

    def cut(self) -> None:
        self.is_cut = True
        self.cut_connections()

    def heal(self) -> None:
        self.is_cut = False
