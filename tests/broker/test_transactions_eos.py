"""Exactly-once consume-transform-produce (KIP-447) with confluent-kafka under kill -9: the application
(tests/txn_apps.py eos, its own process) is killed several times and the broker once mid-transaction; the
output topic, read read_committed, must hold each input's output exactly once.

The Java client's version of the same is in tests/java/test_java_transactions.py; both drive the application
with `EosRun` below.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.broker.test_produce_consume import create_topic
from tests.broker_process import BrokerProcess
from tests.clients import Msg, RawClient, ck_produce
from tests.txn_support import TXN_BROKER_OVERRIDES, high_watermark_and_lso, list_offsets, read_ck, txn_app

INPUTS = 100_000
PARTITIONS = 4
DEADLINE = 300.0


def input_messages(n: int) -> list[Msg]:
    return [Msg(f"k{i}".encode(), f"{i:06d}".encode(), partition=i % PARTITIONS) for i in range(n)]


def committed_total(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offsets on `topic`, summed (raw OffsetFetch v7, stable offsets only)."""
    from kbroker.protocol.messages import OffsetFetchRequest

    req = OffsetFetchRequest(group_id=group, require_stable=False, topics=[
        OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=list(range(PARTITIONS)))])
    with RawClient(bootstrap, timeout=5) as raw:
        resp = raw.request(9, 7, req)
    if resp.error_code != 0:
        return -1
    return sum(max(pr.committed_offset, 0) for t in resp.topics for pr in t.partitions if pr.error_code == 0)


class EosRun:
    """Starts the application again whenever it exits or is killed, and kills it and the broker on a schedule
    of progress points (fractions of the input committed)."""

    def __init__(self, broker: BrokerProcess, start_app: Callable[[], subprocess.Popen[str]], group: str,
                 input_topic: str, output_topic: str, dump_signal: int = signal.SIGUSR1) -> None:
        self.broker, self.start_app, self.group = broker, start_app, group
        self.dump_signal = dump_signal  # makes the application print its threads' stacks
        self.input, self.output = input_topic, output_topic
        self.app: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.app_starts = self.app_kills = self.broker_kills = 0

    def _spawn(self) -> None:
        self.app = self.start_app()
        self.app_starts += 1
        out = self.app.stdout

        def drain() -> None:
            assert out is not None
            for line in out:
                self.lines.append(line.rstrip())

        threading.Thread(target=drain, daemon=True).start()

    def kill_app(self) -> None:
        if self.app is not None:
            self.app.kill()
            self.app.wait()
            self.app = None

    def progress(self) -> int:
        try:
            return committed_total(self.broker.bootstrap, self.group, self.input)
        except OSError:
            return -1

    def open_transaction_on_output(self) -> bool:
        """Some output partition holds records past its last stable offset: a transaction is open there. Both
        offsets come from one Fetch answer: the application's transactions can open and commit in less time than
        two ListOffsets round trips take."""
        try:
            marks = high_watermark_and_lso(self.broker.bootstrap, self.output, range(PARTITIONS))
        except (OSError, AssertionError):
            return False
        return any(lso < hw for hw, lso in marks.values())

    def run(self, app_kill_points: list[float], broker_kill_point: float) -> None:
        kills = sorted([(f, "app") for f in app_kill_points] + [(broker_kill_point, "broker")])
        deadline = time.monotonic() + DEADLINE
        try:
            self._spawn()
            while True:
                if time.monotonic() > deadline:
                    if self.app is not None and self.app.poll() is None:
                        self.app.send_signal(self.dump_signal)
                        time.sleep(1)
                    raise AssertionError(
                        f"not done after {DEADLINE}s: {self.progress()} of {INPUTS} committed; app starts "
                        f"{self.app_starts}; last app lines:\n" + "\n".join(self.lines[-60:])
                        + f"\n--- broker log (tail):\n{self.broker.read_log()[-3000:]}")
                done = self.progress()
                if done == INPUTS:
                    break
                if self.app is None or self.app.poll() is not None:
                    self._spawn()
                if kills and done >= kills[0][0] * INPUTS:
                    what = kills.pop(0)[1]
                    if what == "app":
                        self.kill_app()
                        self.app_kills += 1
                    else:
                        self._kill_broker_mid_transaction(deadline)
                time.sleep(0.1)
        finally:
            self.kill_app()
        assert not kills, f"kills left over: {kills}"

    def _kill_broker_mid_transaction(self, deadline: float) -> None:
        while not self.open_transaction_on_output():
            assert time.monotonic() < deadline, "never saw an open transaction on the output topic"
            time.sleep(0.01)
        self.broker.kill()
        self.broker_kills += 1
        time.sleep(1.0)
        self.broker.start()

    def check_output(self) -> None:
        """read_committed: every input's output exactly once (keys kept)."""
        tps = [(self.output, p) for p in range(PARTITIONS)]
        seen = read_ck(self.broker.bootstrap, tps, INPUTS, True, timeout=120)
        counts = collections.Counter(s.value for s in seen)
        dupes = [v for v, n in counts.items() if n > 1]
        missing = {f"out-{i:06d}".encode() for i in range(INPUTS)} - set(counts)
        assert not dupes and not missing, (f"{len(seen)} records read: {len(dupes)} duplicated (e.g. {dupes[:5]}), "
                                           f"{len(missing)} missing (e.g. {sorted(missing)[:5]})")
        # Nothing committed beyond the outputs read: the LSO of every partition is past the last one read.
        lso = list_offsets(self.broker.bootstrap, self.output, range(PARTITIONS), 1)
        last = {p: max(s.offset for s in seen if s.partition == p) for p in range(PARTITIONS) if
                any(s.partition == p for s in seen)}
        committed_after = read_ck(self.broker.bootstrap, tps, INPUTS + 1, True, timeout=3)
        assert len(committed_after) == INPUTS, f"{len(committed_after) - INPUTS} more committed records"
        assert all(lso[p] > last[p] for p in last)


def prepare(broker: BrokerProcess, base: str) -> tuple[str, str]:
    input_topic, output_topic = f"{base}-in", f"{base}-out"
    create_topic(broker.bootstrap, input_topic, partitions=PARTITIONS)
    create_topic(broker.bootstrap, output_topic, partitions=PARTITIONS)
    ck_produce(broker.bootstrap, input_topic, input_messages(INPUTS), **{"linger.ms": 20})
    return input_topic, output_topic


def test_exactly_once_confluent_app_and_broker_kill_9(tmp_path: Path, topic_name: str) -> None:
    broker = BrokerProcess(tmp_path, TXN_BROKER_OVERRIDES).start()
    try:
        input_topic, output_topic = prepare(broker, topic_name)
        group, txn_id = f"{topic_name}-group", f"{topic_name}-txn"
        run = EosRun(broker, lambda: txn_app("eos", broker.bootstrap, input_topic, output_topic, group, txn_id),
                     group, input_topic, output_topic)
        run.run(app_kill_points=[0.15, 0.35, 0.8], broker_kill_point=0.55)
        assert run.app_kills == 3 and run.broker_kills == 1
        run.check_output()
    finally:
        broker.kill()
