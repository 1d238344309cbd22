"""Apache Kafka as a peer: the official jars from the Maven cache, one JVM broker on loopback, ZooKeeper or KRaft.

`python -m bench.peers.kafka fetch 3.9|4` resolves `org.apache.kafka:kafka_2.13` and its runtime dependencies into
the cache once; `python -m bench.peers.kafka run 4` starts a broker and prints its bootstrap until interrupted.
`KafkaPeer` is what the benchmark and the comparison tests use: it writes a server.properties, formats the KRaft
metadata log when needed, starts `kafka.Kafka` and returns once a Metadata request is answered with a controller.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.peers.maven import ArtifactUnavailable, jars
from bench.peers.ports import free_port
from bench.peers.process import PeerProcess
from bench.peers.zookeeper import ZooKeeperServer, zookeeper_missing

__all__ = ["ArtifactUnavailable", "KafkaPeer", "fetch", "full_version"]

# "3.9" and "4" name the releases the cache already holds (sets kafka-3.9.2 and kafka-4.4.0); slf4j-simple is the
# logger binding, since the kafka_2.13 artifact brings none and Kafka would otherwise log nowhere.
ALIASES = {"3.9": "3.9.2", "3": "3.9.2", "4": "4.4.0", "4.4": "4.4.0"}
SLF4J_SIMPLE = "org.slf4j:slf4j-simple:1.7.36"
# The flags of Kafka's own kafka-run-class.sh (KAFKA_JVM_PERFORMANCE_OPTS), so the JVM is tuned as users run it.
JVM_PERFORMANCE_OPTS = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
]
LOG4J2 = """status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


def full_version(version: str) -> str:
    """The release a short name stands for ("3.9" -> "3.9.2", "4" -> "4.4.0"); full versions stay as they are."""
    return ALIASES.get(version, version)


def _set(version: str) -> tuple[str, list[str]]:
    full = full_version(version)
    if full == "3.9.1":  # the cache's first set, resolved without a logger binding: keep its name and key
        return "kafka-3.9", [f"org.apache.kafka:kafka_2.13:{full}"]
    return f"kafka-{full}", [f"org.apache.kafka:kafka_2.13:{full}", SLF4J_SIMPLE]


def fetch(version: str) -> Path:
    """The folder of Kafka `version`'s jars, resolved into the cache on first use; ArtifactUnavailable otherwise."""
    name, coordinates = _set(version)
    return jars(name, coordinates)


def classpath(version: str) -> str:
    return os.pathsep.join(str(p) for p in sorted(fetch(version).glob("*.jar")))


def _cluster_id() -> str:
    # Kafka's Uuid.toString: URL-safe base64 without padding; Kafka never hands out one starting with "-".
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class KafkaPeer(PeerProcess):
    """One Apache Kafka broker (ZooKeeper mode, or a KRaft combined broker+controller) on a loopback port."""

    def __init__(
        self,
        version: str = "3.9",
        mode: str | None = None,
        zookeeper: str | None = None,
        overrides: dict[str, str] | None = None,
        base: Path | None = None,
        broker_id: int = 0,
        heap: str = "512m",
        log_level: str = "WARN",
    ) -> None:
        self.version = full_version(version)
        major = int(self.version.split(".")[0])
        self.mode = mode or ("zk" if major < 4 else "kraft")
        if self.mode not in ("zk", "kraft"):
            raise ValueError(f"mode must be 'zk' or 'kraft', not {self.mode!r}")
        if self.mode == "zk" and major >= 4:
            raise ValueError(f"Kafka {self.version} has no ZooKeeper mode (removed in 4.0): use mode='kraft'")
        self.zookeeper = zookeeper
        self.overrides = dict(overrides or {})
        self._own_base = base is None
        self.base = (
            Path(base) if base is not None else Path(tempfile.mkdtemp(prefix=f"kafka-{self.version}-"))
        )
        self.broker_id = broker_id
        self.heap = heap
        self.log_level = log_level
        self.port = free_port()
        self.controller_port = free_port() if self.mode == "kraft" else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None  # seconds from exec to the first answered Metadata request
        self._zk: ZooKeeperServer | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_dirs(self) -> Path:
        return self.base / "data"

    @property
    def log_path(self) -> Path:
        return self.base / "kafka.log"

    def properties(self) -> dict[str, str]:
        """server.properties as written: a single-node installation (replication factor 1 for internal topics)."""
        props = {
            "log.dirs": str(self.log_dirs),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "50",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        if self.mode == "zk":
            props |= {
                "broker.id": str(self.broker_id),
                "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
                "zookeeper.connect": self.zookeeper or "",
            }
        else:
            props |= {
                "process.roles": "broker,controller",
                "node.id": str(self.broker_id),
                "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
                "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "share.coordinator.state.topic.replication.factor": "1",
                "share.coordinator.state.topic.min.isr": "1",
            }
        return props | self.overrides

    def _java(self, cp: str) -> list[str]:
        return [
            "java",
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            *JVM_PERFORMANCE_OPTS,
            f"-Dorg.slf4j.simpleLogger.logFile={self.log_path}",
            f"-Dorg.slf4j.simpleLogger.defaultLogLevel={self.log_level.lower()}",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            f"-Dlog4j2.configurationFile={self.base / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.base}",
            "-cp",
            cp,
        ]

    def _format(self, cp: str, config: Path) -> None:
        if (self.log_dirs / "meta.properties").exists():
            return  # a restart after stop() or kill(): the metadata log is already there
        cmd = [
            *self._java(cp),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            _cluster_id(),
            "-c",
            str(config),
            "--standalone",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(
                f"kafka-storage format failed ({r.returncode}): {(r.stdout + r.stderr)[-2000:]}"
            )

    def start(self, timeout: float = 180.0) -> KafkaPeer:
        if shutil.which("java") is None:
            raise ArtifactUnavailable("java is not installed (needed to run Apache Kafka)")
        cp = classpath(self.version)
        self.base.mkdir(parents=True, exist_ok=True)
        self.log_dirs.mkdir(exist_ok=True)
        if self.mode == "zk" and self.zookeeper is None:
            if self._zk is None:
                why = zookeeper_missing()
                if why:
                    raise ArtifactUnavailable(why)
                self._zk = ZooKeeperServer(self.base / "zookeeper").start()
            self.zookeeper = self._zk.connect
        (self.base / "log4j2.properties").write_text(
            LOG4J2.format(path=self.log_path, level=self.log_level.upper())
        )
        config = self.base / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        if self.mode == "kraft":
            self._format(cp, config)
        began = time.monotonic()
        with open(self.base / "kafka.out", "ab") as out:
            self.proc = subprocess.Popen(
                [*self._java(cp), "kafka.Kafka", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base,
            )
        deadline = began + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"Kafka {self.version} exited with {self.proc.returncode}:\n{self.read_log()}"
                )
            if self._answers():
                self.started_in = time.monotonic() - began
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"Kafka {self.version} did not answer Metadata within {timeout:.0f} s:\n{self.read_log()}"
        )

    def _answers(self) -> bool:
        from kbroker_tools.wire import WireClient  # the project's own blocking protocol client

        try:
            with WireClient(self.bootstrap, timeout=2.0, client_id="kafka-peer") as c:
                md = c.metadata([])
        except (OSError, ValueError, ConnectionError):
            return False
        return bool(md.brokers) and md.controller_id >= 0

    def read_log(self, tail: int = 4000) -> str:
        text = ""
        for name in ("kafka.out", "kafka.log"):
            try:
                text += (self.base / name).read_text(errors="replace")
            except OSError:
                pass
        return text[-tail:]

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (Kafka's controlled shutdown), SIGKILL after `timeout`; then the ZooKeeper it started, if any."""
        self._terminate(timeout)
        if self._zk is not None:
            self._zk.stop()
            self._zk = None
            self.zookeeper = None



def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("fetch", "run"):
        print(
            "usage: python -m bench.peers.kafka fetch|run VERSION   (VERSION: 3.9, 4 or a full release)",
            file=sys.stderr,
        )
        return 2
    try:
        if argv[0] == "fetch":
            print(fetch(argv[1]))
            return 0
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        with KafkaPeer(argv[1], heap=os.environ.get("KAFKA_HEAP", "1g"), log_level="INFO") as peer:
            print(
                f"READY {peer.bootstrap} (Kafka {peer.version}, {peer.mode}, {peer.started_in:.1f} s, "
                f"log {peer.log_path})",
                flush=True,
            )
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except (ArtifactUnavailable, RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
