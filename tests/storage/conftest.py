from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


@pytest.fixture
def make_log(log_dir: Path) -> Iterator:
    opened: list[Log] = []

    def make(config: LogConfig | None = None, **kw: object) -> Log:
        cfg = config or LogConfig()
        if kw:
            cfg = cfg.replace(**kw)
        log = Log.open(log_dir, "topic", 0, cfg, clean_shutdown=True)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()
