"""A plain HTTP client of the registry as Confluent's API reference documents it (urllib, no registry library),
and a broker process with the registry on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.broker_process import BrokerProcess, free_port, wait_for_port

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def registry_broker(data_dir: Path, overrides: dict[str, str] | None = None) -> tuple[BrokerProcess, str]:
    """A started broker with schema.registry.listeners on a free port, and the registry's URL."""
    port = free_port()
    b = BrokerProcess(
        data_dir, {"schema.registry.listeners": f"http://127.0.0.1:{port}", **(overrides or {})}
    )
    b.start()
    wait_for_port(port)
    return b, f"http://127.0.0.1:{port}"


class Http:
    def __init__(self, base: str) -> None:
        self.base = base

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = CONTENT_TYPE,
        raw: bytes | None = None,
    ) -> tuple[int, str, Any]:
        """(status, response content type, decoded JSON body)."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, method=method, data=data)
        if data is not None:
            req.add_header("Content-Type", content_type)
        req.add_header("Accept", CONTENT_TYPE)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.headers.get("Content-Type", ""), json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), json.loads(e.read() or b"null")

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, content_type, payload = self.call(method, path, body)
        assert status == 200 and content_type == CONTENT_TYPE, (method, path, status, payload)
        return payload

    def error(self, method: str, path: str, body: Any = None) -> tuple[int, int, str]:
        """(HTTP status, error_code, message) of a request that must fail."""
        status, _, payload = self.call(method, path, body)
        assert status >= 400 and set(payload) == {"error_code", "message"}, (method, path, status, payload)
        return status, payload["error_code"], payload["message"]
