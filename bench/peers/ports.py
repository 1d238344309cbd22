"""Free loopback ports for peers, never the same one twice from this process."""

from __future__ import annotations

import socket

# A port just released may come back from the next bind to port 0: two listeners of one broker once got the same
# one (the broker stopped at startup, "Address already in use").
_handed_out: set[int] = set()


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
