"""Tansu (a Kafka-compatible broker in Rust) as a peer: its memory storage engine, one process on loopback.

The binary lives in KBROKER_CACHE/tansu/bin; `python -m bench.peers.tansu build` runs `cargo install` into it when
it is missing (about 20 minutes on 2 cores, so never in CI), with the `dynostore` feature: tansu's default build has
no storage engine at all, and memory:// is dynostore's. `TansuPeer` raises ArtifactUnavailable without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.peers.maven import ArtifactUnavailable, cache_root
from bench.peers.ports import free_port
from bench.peers.process import PeerProcess

VERSION = "0.6.0"
FEATURES = "dynostore"


def binary() -> Path:
    return cache_root() / "tansu" / "bin" / "tansu"


def build(timeout: float = 3600.0) -> Path:
    """The tansu binary, compiled by `cargo install --root <cache>/tansu` on first use."""
    if binary().is_file():
        return binary()
    cargo = shutil.which("cargo")
    if cargo is None:
        raise ArtifactUnavailable("tansu is not built and there is no `cargo` to build it")
    root = cache_root() / "tansu"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.log", "ab") as log:
        r = subprocess.run(
            [
                cargo,
                "install",
                "--locked",
                "--force",
                "--root",
                str(root),
                "tansu",
                "--version",
                VERSION,
                "--features",
                FEATURES,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            env={**os.environ, "CARGO_TARGET_DIR": str(root / "target")},
        )
    if r.returncode != 0 or not binary().is_file():
        raise ArtifactUnavailable(f"cargo install tansu {VERSION} failed (see {root / 'build.log'})")
    return binary()


class TansuPeer(PeerProcess):
    """One tansu broker with the memory:// storage engine (nothing on disk) on a loopback port."""

    def __init__(self, storage: str = "memory://tansu/", base: Path | None = None) -> None:
        self.storage = storage
        self._own_base = base is None
        self.base = Path(base) if base is not None else Path(tempfile.mkdtemp(prefix="tansu-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.base / "tansu.log"

    def start(self, timeout: float = 60.0) -> TansuPeer:
        exe = binary()
        if not exe.is_file():
            raise ArtifactUnavailable(f"tansu is not built ({exe}): run `python -m bench.peers.tansu build`")
        self.base.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{self.port}"
        began = time.monotonic()
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(exe),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    self.storage,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                env={**os.environ, "RUST_LOG": "warn"},
            )
        while time.monotonic() < began + timeout:
            if self.proc.poll() is not None:
                log = self.read_log()
                if "FeatureNotEnabled" in log:
                    raise ArtifactUnavailable(
                        f"this tansu build ({exe}) has no {self.storage} storage engine "
                        f"(cargo feature {FEATURES}): rebuild with `python -m bench.peers.tansu "
                        "build` after removing it"
                    )
                raise RuntimeError(f"tansu exited with {self.proc.returncode}:\n{log}")
            if self._answers():
                self.started_in = time.monotonic() - began
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"tansu did not answer Metadata within {timeout:.0f} s:\n{self.read_log()}")

    def _answers(self) -> bool:
        from kbroker_tools.wire import WireClient

        try:
            with WireClient(self.bootstrap, timeout=2.0, client_id="tansu-peer") as c:
                return bool(c.metadata([]).brokers)
        except (OSError, ValueError, ConnectionError):
            return False

    def read_log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        self._terminate(timeout)

def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print("usage: python -m bench.peers.tansu build", file=sys.stderr)
        return 2
    try:
        print(build())
    except ArtifactUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
