"""kbroker-admin log-dirs --describe against a broker with two log dirs: kafka-log-dirs' lines and JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tests.broker.test_log_dirs import _broker, _create, _placement
from tests.tools.test_admin_cli import admin


def test_log_dirs_describe(tmp_path: Path) -> None:
    b, dirs = _broker(tmp_path, 2)
    try:
        _create(b.bootstrap, "shown")
        _create(b.bootstrap, "hidden")
        r = admin("log-dirs", "--bootstrap-server", b.bootstrap, "--describe", "--topic-list", "shown")
        lines = r.stdout.splitlines()
        assert lines[:2] == [
            "Querying brokers for log directories information",
            "Received log directory information from brokers 0",
        ]
        out = json.loads(lines[2])
        assert out["version"] == 1 and [x["broker"] for x in out["brokers"]] == [0]
        by_dir = {d["logDir"]: d for d in out["brokers"][0]["logDirs"]}
        assert set(by_dir) == {str(d) for d in dirs}
        assert all(d["error"] is None for d in by_dir.values())
        where = [d for d, v in by_dir.items() if v["partitions"]]
        assert len(where) == 1 and by_dir[where[0]]["partitions"] == [
            {"partition": "shown-0", "size": 0, "offsetLag": 0, "isFuture": False}
        ]
        assert Path(where[0]) == Path(_placement(b.bootstrap)[("shown", 0, False)][0])
        err = admin("log-dirs", "--bootstrap-server", b.bootstrap, "--describe", "--broker-list", "0,7", rc=1)
        assert err.stderr.strip() == (
            "Error: The given brokers do not exist from --broker-list: 7. Current existent brokers: 0"
        )
        admin("log-dirs", "--bootstrap-server", b.bootstrap, rc=1)  # --describe is required
    finally:
        b.kill()
