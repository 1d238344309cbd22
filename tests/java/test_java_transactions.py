"""The Java client's transactions (kafka-clients 3.9, TxnCompat.java beside this file) against a real kbroker:
commit and abort read back by Java and Python clients at both isolation levels, fencing, offsets sent to a
transaction with require_stable, and exactly-once consume-transform-produce under kill -9."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker.test_produce_consume import create_topic
from tests.broker.test_transactions_eos import EosRun, prepare
from tests.broker_process import BrokerProcess
from tests.clients import Msg, ck_produce, wait_until
from tests.java.test_java_client import JAVA_LOG, _missing, compile_java
from tests.txn_support import (
    READERS,
    TXN_BROKER_OVERRIDES,
    Seen,
    end_offsets,
    expected_reads,
    list_offsets,
    plan_transactions,
    read_ck,
)

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "TxnCompat.java", HERE / "org" / "slf4j" / "impl" / "StaticLoggerBinder.java"]
JAVA_TIMEOUT = 180

_why = _missing()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_java(tmp_path_factory, SOURCES, "txn-java-classes")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), TXN_BROKER_OVERRIDES)
    b.start()
    yield b
    b.stop()


def java_cmd(classpath: str, bootstrap: str, scenario: str, **args: Any) -> list[str]:
    return ["java", f"-Dkcompat.log={JAVA_LOG}", "-cp", classpath, "TxnCompat", bootstrap, scenario,
            *(f"{k}={v}" for k, v in args.items())]


def run_txn_java(classpath: str, broker: BrokerProcess, scenario: str, **args: Any) -> list[str]:
    """Run one scenario to its end; its stdout lines (it must end with DONE)."""
    try:
        r = subprocess.run(java_cmd(classpath, broker.bootstrap, scenario, **args), capture_output=True, text=True,
                           timeout=JAVA_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"TxnCompat {scenario} timed out; stdout:\n{e.stdout!r}\nbroker log:\n"
                             f"{broker.read_log()[-4000:]}") from None
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[-1:] == [f"DONE {scenario}"], (
        f"TxnCompat {scenario} {args} exited {r.returncode}\n--- stdout:\n{r.stdout[-6000:]}\n--- stderr:\n"
        f"{r.stderr[-6000:]}\n--- broker log (tail):\n{broker.read_log()[-4000:]}")
    return lines


def read_java(classpath: str, broker: BrokerProcess, layout: dict[str, int], count: int,
              committed: bool) -> list[Seen]:
    lines = run_txn_java(classpath, broker, "read", layout=",".join(f"{t}:{n}" for t, n in layout.items()),
                         count=count, isolation="read_committed" if committed else "read_uncommitted")
    out = []
    for line in lines:
        if line.startswith("SEEN "):
            _, t, p, o, v = line.split(" ", 4)
            out.append(Seen(t, int(p), int(o), v.encode()))
    return sorted(out)


def test_java_commit_and_abort_read_by_every_client(classpath: str, broker: BrokerProcess, topic_name: str) -> None:
    layout = {f"{topic_name}-a": 3, f"{topic_name}-b": 2}
    for t, n in layout.items():
        create_topic(broker.bootstrap, t, partitions=n)
    outcomes = [True, False, True]
    lines = run_txn_java(classpath, broker, "produce", layout=",".join(f"{t}:{n}" for t, n in layout.items()),
                         per=20, outcomes="cac", tag="java", txnid=f"{topic_name}-txn")
    assert [line for line in lines if line.startswith("OK ")] == [
        "OK transaction 0 committed (100 records)", "OK transaction 1 aborted (100 records)",
        "OK transaction 2 committed (100 records)"]
    txns = plan_transactions("java", layout, 20, outcomes)
    ends = end_offsets(txns)
    for t, n in layout.items():
        want = {p: ends[(t, p)] for p in range(n)}
        wait_until(lambda t=t, n=n, want=want: list_offsets(broker.bootstrap, t, range(n), 1) == want, timeout=15,
                   interval=0.05, what=f"LSO of {t} at {want}")

    committed = expected_reads(txns, outcomes, committed_only=True)
    everything = expected_reads(txns, outcomes, committed_only=False)
    tps = [(t, p) for t, n in layout.items() for p in range(n)]
    assert read_java(classpath, broker, layout, len(committed), True) == committed
    assert read_java(classpath, broker, layout, len(everything), False) == everything
    for reader in ("confluent", "kafka-python", "aiokafka"):
        assert READERS[reader](broker.bootstrap, tps, len(committed), True) == committed, reader
        assert READERS[reader](broker.bootstrap, tps, len(everything), False) == everything, reader


def test_java_reads_what_python_clients_committed(classpath: str, broker: BrokerProcess, topic_name: str) -> None:
    from tests.txn_support import run_ck

    layout = {topic_name: 3}
    create_topic(broker.bootstrap, topic_name, partitions=3)
    outcomes = [False, True, False, True]
    txns = plan_transactions("ck", layout, 15, outcomes)
    run_ck(broker.bootstrap, f"{topic_name}-txn", txns, outcomes)
    committed = expected_reads(txns, outcomes, committed_only=True)
    everything = expected_reads(txns, outcomes, committed_only=False)
    assert read_java(classpath, broker, layout, len(committed), True) == committed
    assert read_java(classpath, broker, layout, len(everything), False) == everything


def test_java_zombie_fencing(classpath: str, broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    lines = run_txn_java(classpath, broker, "fence", topic=topic_name, txnid=f"{topic_name}-txn")
    assert any(line.startswith("OK zombie fenced") for line in lines), lines
    assert [s.value for s in read_ck(broker.bootstrap, [(topic_name, 0)], 1, True)] == [b"young"]
    assert [s.value for s in read_ck(broker.bootstrap, [(topic_name, 0)], 2, False)] == [b"zombie", b"young"]


def test_java_admin_lists_describes_and_aborts_transactions(classpath: str, broker: BrokerProcess,
                                                           topic_name: str) -> None:
    """ListTransactions, DescribeTransactions, DescribeProducers and KIP-664's abortTransaction (WriteTxnMarkers
    sent by the admin client to the partition leader)."""
    create_topic(broker.bootstrap, topic_name, partitions=1)
    lines = run_txn_java(classpath, broker, "admin", topic=topic_name, txnid=f"{topic_name}-txn")
    for want in ("OK listTransactions", "OK describeTransactions ONGOING", "OK describeProducers current",
                 "OK describeTransactions COMPLETE_COMMIT", "OK abortTransaction closed"):
        assert any(line.startswith(want) for line in lines), (want, lines)
    # offset 0 committed, its marker at 1, the hanging record at 2 aborted by the admin client's marker at 3; the
    # producer's close then aborts the coordinator's side of that transaction too (a marker at 4, completing nothing)
    def settled() -> dict[int, int] | None:
        lso, hw = (list_offsets(broker.bootstrap, topic_name, [0], level) for level in (1, 0))
        return lso if lso == hw else None

    assert wait_until(settled, timeout=15, interval=0.05, what="LSO at the high watermark") in ({0: 4}, {0: 5})
    assert [s.value for s in read_ck(broker.bootstrap, [(topic_name, 0)], 1, True)] == [b"open"]


def test_java_send_offsets_to_transaction(classpath: str, broker: BrokerProcess, topic_name: str) -> None:
    output = f"{topic_name}-out"
    create_topic(broker.bootstrap, topic_name, partitions=1)
    create_topic(broker.bootstrap, output, partitions=1)
    ck_produce(broker.bootstrap, topic_name, [Msg(None, f"in-{i}".encode(), partition=0) for i in range(10)])
    lines = run_txn_java(classpath, broker, "offsets", input=topic_name, output=output, group=f"{topic_name}-g",
                         txnid=f"{topic_name}-txn")
    assert "OK require_stable committed() waited for the commit and saw 5" in lines
    assert "OK aborted offsets vanished" in lines
    assert [s.value for s in read_ck(broker.bootstrap, [(output, 0)], 1, True)] == [b"out-0"]


def test_exactly_once_java_app_and_broker_kill_9(classpath: str, tmp_path: Path, topic_name: str) -> None:
    b = BrokerProcess(tmp_path, TXN_BROKER_OVERRIDES).start()
    try:
        input_topic, output_topic = prepare(b, topic_name)
        group, txn_id = f"{topic_name}-group", f"{topic_name}-txn"

        def start() -> subprocess.Popen[str]:
            return subprocess.Popen(java_cmd(classpath, b.bootstrap, "eos", input=input_topic, output=output_topic,
                                             group=group, txnid=txn_id),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

        run = EosRun(b, start, group, input_topic, output_topic, dump_signal=signal.SIGQUIT)  # jstack-like dump
        run.run(app_kill_points=[0.15, 0.35, 0.8], broker_kill_point=0.55)
        assert run.app_kills == 3 and run.broker_kills == 1
        run.check_output()
    finally:
        b.kill()
