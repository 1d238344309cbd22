"""Memory from announced frame sizes: connections that announce 100 MB requests and trickle their bytes get
memory as their bytes arrive, within queued.max.request.bytes (configs/server.properties), while ordinary
clients keep working and large produce requests that do arrive still go through."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from confluent_kafka import Producer

from tests.broker_process import BrokerProcess
from tests.clients import Msg, ck_consume, ck_produce

ANNOUNCED = 100_000_000  # just under socket.request.max.bytes
CONNECTIONS = 200


def _rss_kb(b: BrokerProcess, key: str = "VmRSS") -> int:
    status = Path(f"/proc/{b.proc.pid}/status").read_text()  # type: ignore[union-attr]
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(key)))


def test_announced_sizes_cost_no_memory_until_their_bytes_arrive(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path).start()
    socks: list[socket.socket] = []
    try:
        ck_produce(b.bootstrap, "normal", [Msg(None, b"warm-up", partition=0)])
        before = _rss_kb(b)
        # A Produce header (api key 0, v7) after the announced size, then a trickle of bytes.
        head = struct.pack(">ihhi", ANNOUNCED, 0, 7, 1) + b"\x00\x05trick"
        for _ in range(CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", b.port), timeout=10)
            s.sendall(head)
            socks.append(s)
        deadline = time.monotonic() + 8
        peak = before
        rounds = 0
        while time.monotonic() < deadline:
            for s in socks:
                try:
                    s.send(b"\x00" * 64)
                except OSError:
                    pass  # a muted connection's socket buffer may be full
            rounds += 1
            peak = max(peak, _rss_kb(b))
            # Ordinary clients are served meanwhile.
            assert len(ck_produce(b.bootstrap, "normal", [Msg(None, b"during-%d" % rounds, partition=0)],
                                  timeout=20)) == 1
            time.sleep(0.2)
        got = ck_consume(b.bootstrap, "normal", [0], rounds + 1, timeout=20)
        assert [r.value for r in got][-1] == b"during-%d" % rounds
        assert peak < 300 * 1024, f"broker RSS went from {before} kB to {peak} kB"
        assert "queued.max.request.bytes" in b.read_log(), "the pool limit was never reached"

        # The trickling connections go (else they hold the pool until request.timeout.ms cuts them, ~20 s): their
        # memory returns to the pool, and a large produce request that arrives whole is admitted and appended.
        for s in socks:
            s.close()
        socks.clear()
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 50, "batch.size": 8_000_000,
                      "message.max.bytes": 10_000_000})
        for _ in range(8):
            p.produce("normal", value=b"L" * 900_000, partition=0)
        assert p.flush(60) == 0
        print(f"\n{CONNECTIONS} connections announcing {ANNOUNCED} bytes: RSS {before} kB -> peak {peak} kB over "
              f"{rounds} rounds")
    finally:
        for s in socks:
            s.close()
        b.stop()
