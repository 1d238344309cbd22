"""One confluent-kafka member of a KIP-848 group (group.protocol=consumer), in a process of its own so that a test
can kill -9 it: `python -m tests.consumer_member BOOTSTRAP TOPIC GROUP`.

Prints, each line flushed at once (a SIGKILL loses nothing that was consumed before it):
  `M <member id>`                              once, when it first has partitions
  `R <monotonic s> <partition> <offset> <value>` per record
  `E <error>`                                  per consumer error
  `CLOSED`                                     after a clean close, which starts when stdin reaches EOF.
Offsets are auto-committed every 200 ms, so a killed member leaves up to that much uncommitted behind.
Mirrors tests/java/ConsumerGroupMember.java; tests/group_kill.py drives both.
"""

from __future__ import annotations

import sys
import threading
import time

from confluent_kafka import Consumer


def main(bootstrap: str, topic: str, group: str) -> None:
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                  "auto.offset.reset": "earliest", "enable.auto.commit": True, "auto.commit.interval.ms": 200})
    c.subscribe([topic])
    out = sys.stdout
    announced = False
    while not stop.is_set():
        m = c.poll(0.1)
        if not announced and c.assignment():
            out.write(f"M {c.memberid()}\n")
            out.flush()
            announced = True
        if m is None:
            continue
        if m.error():
            out.write(f"E {m.error()}\n")
        else:
            value = m.value() or b""
            out.write(f"R {time.monotonic():.6f} {m.partition()} {m.offset()} {value.decode()}\n")
        out.flush()
    c.close()
    out.write("CLOSED\n")
    out.flush()


if __name__ == "__main__":
    main(*sys.argv[1:4])
