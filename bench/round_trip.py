"""What one loopback request and its answer cost a server process here, doing nothing but receive and send.

    python -m bench.round_trip [--requests N] [--reps R]

A Kafka client that waits for each answer before it sends the next request makes the broker sleep and wake once per
request. On this project's 2-core VM the wake-up itself (scheduler, the inter-processor interrupt of the answer's
wake-up of the client, the TCP stack on both ends of the loopback) costs the server tens of microseconds of CPU,
almost all in the kernel, whatever the server does with the request. That is the floor under any broker's CPU per
request, the C mock's included; the bench prints it with the machine so that CPU per message can be read against it.
The server here is a blocking Python loop (recv, send): its own code is a few microseconds of the figure.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from bench.harness import cpu_seconds, user_system_seconds
from bench.produce_path import recv_exact

MESSAGE = 64


def _server(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        data = conn.recv(1 << 16)
        if not data:
            os._exit(0)
        conn.sendall(data)


def measure(requests: int = 20_000, in_flight: int = 1) -> tuple[float, float]:
    """(all, system) us of the server's CPU per request, with in_flight requests outstanding at a time."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    pid = os.fork()
    if pid == 0:
        try:
            _server(listener)
        finally:
            os._exit(1)
    address = listener.getsockname()
    listener.close()
    try:
        with socket.create_connection(address) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            msg = b"x" * MESSAGE
            s.sendall(msg * in_flight)
            recv_exact(s, MESSAGE * in_flight)  # connected and warm
            c0, (_, s0) = cpu_seconds(pid), user_system_seconds(pid)
            sent = received = 0
            while received < requests:
                while sent < requests and sent - received < in_flight:
                    s.sendall(msg)
                    sent += 1
                recv_exact(s, MESSAGE)
                received += 1
            c1, (_, s1) = cpu_seconds(pid), user_system_seconds(pid)
        return (c1 - c0) / requests * 1e6, (s1 - s0) / requests * 1e6
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def describe(requests: int = 20_000) -> str:
    one = measure(requests, 1)
    many = measure(requests, 16)
    return (f"{one[0]:.1f} us of server CPU per request answered one at a time ({one[1]:.1f} us of it in the "
            f"kernel), {many[0]:.1f} us with 16 in flight ({requests:,} requests of {MESSAGE} B, a blocking "
            f"recv/send loop)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.round_trip", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    for rep in range(args.reps):
        t = time.monotonic()
        print(f"rep {rep + 1}: {describe(args.requests)}; {time.monotonic() - t:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
