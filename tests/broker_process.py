"""Start and stop a real kbroker process for tests: free loopback port, temp data dir, kill -9 support."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from bench.peers.ports import free_port
from tests.clients import wait_until

ROOT = Path(__file__).resolve().parent.parent


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    """Until something accepts on 127.0.0.1:port: the HTTP endpoints a broker serves (console, schema registry,
    metrics) bind just after its Kafka listeners, which BrokerProcess.start waits for."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class BrokerProcess:
    """`python -m kbroker.broker` with configs/server.properties plus overrides, bound to 127.0.0.1."""

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None, port: int | None = None,
                 open_files_limit: int | None = None, env: dict[str, str] | None = None) -> None:
        """open_files_limit: the broker's RLIMIT_NOFILE (soft and hard), for tests of descriptor exhaustion;
        env: variables added to the broker's environment."""
        self.open_files_limit = open_files_limit
        self.env = env
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.overrides = {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": str(self.data_dir / "logs"),
            "group.initial.rebalance.delay.ms": "0",
            **(overrides or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "kbroker.broker", str(ROOT / "configs" / "server.properties")]
        for k, v in self.overrides.items():
            args += ["--override", f"{k}={v}"]
        logf = open(self.log_path, "ab")
        limit = self.open_files_limit
        self.proc = subprocess.Popen(
            args, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT,
            env=None if self.env is None else {**os.environ, **self.env},
            preexec_fn=None if limit is None else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
        )
        logf.close()
        deadline = time.monotonic() + timeout
        # Every listener: one whose port another process took after free_port() stops the broker just after the
        # first one accepted, and the test then met a bare "connection refused".
        for port in self.listen_ports():
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.read_log()[-4000:]}")
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() >= deadline:
                        self.kill()
                        raise RuntimeError(f"broker did not listen on port {port} within {timeout}s:\n"
                                           f"{self.read_log()[-4000:]}") from None
                    time.sleep(0.05)
        return self

    def listen_ports(self) -> list[int]:
        """The ports start() waits for."""
        return [self.port]

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: a clean shutdown."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("broker did not stop within timeout after SIGTERM") from None
        rc = self.proc.returncode
        self.proc = None
        return rc

    def kill(self) -> None:
        """kill -9: no shutdown hooks, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()


def wait_all_registered(brokers: list[BrokerProcess], timeout: float = 20.0) -> None:
    """Until every broker's Metadata lists them all. One broker's view is not enough: each learns the others from
    its own ZooKeeper watch, and the controller (which validates CreateTopics' replica assignments) may be the
    last to hear of a broker (INVALID_REPLICA_ASSIGNMENT "Unknown broker(s)" in one CI run)."""
    admins = [AdminClient({"bootstrap.servers": b.bootstrap}) for b in brokers]
    want = len(brokers)

    def registered() -> bool:
        try:
            return all(len(a.list_topics(timeout=5).brokers) == want for a in admins)
        except KafkaException:  # a broker still starting: ask again
            return False

    wait_until(registered, timeout=timeout, what=f"{want} brokers registered with each of them")
