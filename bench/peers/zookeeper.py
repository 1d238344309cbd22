"""Start and stop a real ZooKeeper server (Debian's `zookeeper` package) for tests and the benchmark's peers.

ZooKeeperServerMain on a free 127.0.0.1 port with a generated zoo.cfg in a temp dir. tickTime is 500 ms,
so sessions may be as short as 1 s (min = 2 x tickTime) and at most 10 s (max = 20 x tickTime).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from bench.peers.ports import free_port

JAVA_DIR = Path("/usr/share/java")
ZK_JAR = JAVA_DIR / "zookeeper.jar"  # its manifest Class-Path names the other jars it needs
LOGGER_JARS = ("slf4j-simple.jar", "slf4j-nop.jar")
TICK_MS = 500


def zookeeper_missing() -> str | None:
    """Why a real ZooKeeper cannot be started here, or None."""
    if not ZK_JAR.exists() and not glob.glob(str(JAVA_DIR / "zookeeper-3*.jar")):
        return "ZooKeeper is not installed (Debian package `zookeeper`: /usr/share/java/zookeeper.jar)"
    if shutil.which("java") is None:
        return "java is not installed (needed to run ZooKeeper)"
    return None


def four_letter(port: int, cmd: str = "ruok", timeout: float = 1.0) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(cmd.encode())
        chunks = []
        while True:
            b = s.recv(4096)
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer:
    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.dir = Path(data_dir)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "zookeeper.log"

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _classpath(self) -> str:
        jars = [str(ZK_JAR if ZK_JAR.exists() else sorted(glob.glob(str(JAVA_DIR / "zookeeper-3*.jar")))[0])]
        for name in LOGGER_JARS:
            if (JAVA_DIR / name).exists():
                jars.append(str(JAVA_DIR / name))
                break
        return os.pathsep.join(jars)

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "data").mkdir(exist_ok=True)
        cfg = self.dir / "zoo.cfg"
        cfg.write_text(
            f"tickTime={TICK_MS}\n"
            f"dataDir={self.dir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "maxClientCnxns=0\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat,mntr\n"
            "forceSync=no\n"
        )
        args = [
            "java",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            self._classpath(),
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(cfg),
        ]
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper exited with {self.proc.returncode}:\n{self.read_log()[-4000:]}"
                )
            try:
                if four_letter(self.port, "ruok") == "imok":
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not answer ruok within {timeout}s:\n{self.read_log()[-4000:]}")

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
