"""What every peer broker process shares: its pid, SIGTERM-then-SIGKILL stop, SIGKILL, its temporary base removed on
close, and use as a context manager."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any


class PeerProcess:
    proc: subprocess.Popen[bytes] | None
    base: Path
    _own_base: bool  # the base is a temporary directory of the peer's own, removed by close()

    def start(self, timeout: float = 60.0) -> Any:
        raise NotImplementedError

    def stop(self, timeout: float = 60.0) -> None:
        self._terminate(timeout)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _terminate(self, timeout: float) -> None:
        """SIGTERM (the broker's controlled shutdown), SIGKILL after `timeout`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash; the data stays, so start() brings the same broker back."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._own_base:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Any:
        if self.proc is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
