"""The registry's HTTP listener at schema.registry.listeners: the Confluent Schema Registry REST API v1 routes,
content types and error bodies, over Registry.

Concurrency model: http.server's threads, one per connection; Registry serialises writes and RegistryState reads
under its lock. Nothing here touches the broker's loops: the store is a Kafka client of the cluster.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from kbroker.schema_registry import errors
from kbroker.schema_registry.election import WriterElection
from kbroker.schema_registry.formats import SCHEMA_TYPES
from kbroker.schema_registry.kafka_store import KafkaStore
from kbroker.schema_registry.registry import Registry, version_json
from kbroker.schema_registry.security import BasicAuth, BrokerConnector, https_context
from kbroker.schema_registry.state import RegistryState

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

log = logging.getLogger("kbroker.schema_registry")

LISTENER = re.compile(r"(https?)://(\[[^\]]*\]|[^:/\s]*):(\d+)")
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
ACCEPTED_BODIES = (
    "application/vnd.schemaregistry.v1+json",
    "application/vnd.schemaregistry+json",
    "application/json",
    "application/octet-stream",
)
MAX_BODY = 8 << 20
FORWARD_TIMEOUT = 30.0  # a writer's broker gone: its group session (10 s) ends and another is elected


class SchemaRegistryServer:
    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        m = LISTENER.fullmatch(server.config["schema.registry.listeners"].strip())
        assert m is not None  # the config check refused anything else
        self.scheme, self.host, self.port = m.group(1), m.group(2).strip("[]"), int(m.group(3))
        self.tls = https_context(server) if self.scheme == "https" else None
        self.connector = BrokerConnector(server)
        self.auth = BasicAuth(server)
        self.state = RegistryState()
        self.store = KafkaStore(self.connector, self.state.apply)
        self.registry = Registry(self.store, self.state)
        # Several brokers (ZooKeeper) serve one registry: one elected writer, the others forward writes to it.
        self.election: WriterElection | None = None
        self._httpd: ThreadingHTTPServer | None = None

    def start(self) -> None:
        class Handler(RegistryHandler):
            pass

        Handler.registry = self.registry
        Handler.frontend = self
        try:
            self._httpd = ThreadingHTTPServer((self.host, self.port), Handler)
        except OSError as e:
            raise OSError(
                e.errno, f"cannot bind schema.registry.listeners to {self.host}:{self.port}: {e.strerror}"
            ) from None
        if self.tls is not None:
            self._httpd.socket = self.tls.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.store.bootstrap = self.connector.bootstrap()
        self.store.start()
        if self.server.config["zookeeper.connect"]:
            host = (
                self.host if self.host not in ("", "0.0.0.0", "::") else self.server.advertised_endpoint()[0]
            )
            identity = {
                "version": 1,
                "host": host,
                "port": self.port,
                "master_eligibility": True,
                "scheme": self.scheme,
            }
            self.election = WriterElection(self.store.bootstrap, self.connector, identity)
            self.election.start()
        threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="kbroker-schema-registry",
            daemon=True,
        ).start()
        log.info(
            "Serving the schema registry on %s://%s:%d/ (topic _schemas through listener %s%s)",
            self.scheme,
            self.host,
            self.port,
            self.connector.listener,
            f"; HTTP basic auth with the SASL users of listener {self.auth.listener}"
            if self.auth.required
            else "",
        )

    def forward_context(self) -> ssl.SSLContext | None:
        """TLS for writes forwarded to another broker's https registry: the broker's inter-broker trust."""
        return self.connector.security.ssl_context if self.scheme == "https" else None

    def stop(self) -> None:
        if self.election is not None:
            self.election.stop()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.store.stop()


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[0].lower() == "true"


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise errors.RegistryError(404, 404, "HTTP 404 Not Found") from None


class RegistryHandler(BaseHTTPRequestHandler):
    registry: Registry
    frontend: SchemaRegistryServer
    server_version = "kbroker-schema-registry"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (http.server's signature)
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, payload: Any, raw: bool = False) -> None:
        body = payload.encode() if raw else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _read_raw(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True  # the unread body would be taken for the next request
            raise errors.RegistryError(413, 413, "HTTP 413 Request Entity Too Large")
        return self.rfile.read(length)

    def _body(self) -> Any:
        data = self._raw
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type and content_type not in ACCEPTED_BODIES:
            raise errors.RegistryError(415, 415, "HTTP 415 Unsupported Media Type")
        try:
            return json.loads(data or b"{}")
        except ValueError as e:
            raise errors.RegistryError(400, 400, f"Unrecognized JSON: {e}") from None

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")] if url.path.strip("/") else []
        query = parse_qs(url.query)
        self._raw = b""
        try:
            self._raw = self._read_raw()
            if self.frontend.auth.required and not self._signed_in():
                self._unauthorized()
                return
            election = self.frontend.election
            if (
                election is not None
                and self._is_write(parts)
                and not election.is_writer
                and self._forward(election)
            ):
                return
            result = self._route(parts, query)
            if isinstance(result, RawSchema):
                self._send(200, result.text, raw=True)
            else:
                self._send(200, result)
        except errors.RegistryError as e:
            self._send(e.status, e.body())
        except (ConnectionError, TimeoutError, OSError) as e:
            self._send(500, errors.store_error(f"Error while reading or writing _schemas: {e}").body())
        except Exception as e:  # a registry bug must not take the broker down: log it, answer 500
            log.exception("schema registry request %s %s failed", self.command, self.path)
            self._send(500, {"error_code": 500, "message": f"{type(e).__name__}: {e}"})

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _dispatch

    def _route(self, parts: list[str], query: dict[str, list[str]]) -> Any:
        r, method = self.registry, "GET" if self.command == "HEAD" else self.command
        deleted, permanent, normalize = (
            _flag(query, "deleted"),
            _flag(query, "permanent"),
            _flag(query, "normalize"),
        )
        match parts:
            case [] if method == "GET":
                return {}
            case ["schemas", "types"] if method == "GET":
                return list(SCHEMA_TYPES)
            case ["schemas", "ids", schema_id] if method == "GET":
                sv = r.schema_by_id(_int(schema_id, "id"))
                out: dict[str, Any] = {}
                if sv.schema_type != "AVRO":
                    out["schemaType"] = sv.schema_type
                if sv.references:
                    out["references"] = sv.references
                out["schema"] = sv.schema
                return out
            case ["schemas", "ids", schema_id, "schema"] if method == "GET":
                return RawSchema(r.schema_by_id(_int(schema_id, "id")).schema)
            case ["schemas", "ids", schema_id, "versions"] if method == "GET":
                return r.id_versions(_int(schema_id, "id"), deleted)
            case ["schemas", "ids", schema_id, "subjects"] if method == "GET":
                return sorted({v["subject"] for v in r.id_versions(_int(schema_id, "id"), deleted)})
            case ["subjects"] if method == "GET":
                return r.subjects(deleted, query.get("subjectPrefix", [""])[0])
            case ["subjects", subject] if method == "POST":
                return version_json(r.lookup(subject, self._body(), normalize, deleted))
            case ["subjects", subject] if method == "DELETE":
                return r.delete_subject(subject, permanent)
            case ["subjects", subject, "versions"] if method == "GET":
                return r.versions(subject, deleted)
            case ["subjects", subject, "versions"] if method == "POST":
                return {"id": r.register(subject, self._body(), normalize)["id"]}
            case ["subjects", subject, "versions", version] if method == "GET":
                return version_json(r.version(subject, version, deleted))
            case ["subjects", subject, "versions", version] if method == "DELETE":
                return r.delete_version(subject, version, permanent)
            case ["subjects", subject, "versions", version, "schema"] if method == "GET":
                return RawSchema(r.version(subject, version, deleted).schema)
            case ["subjects", subject, "versions", version, "referencedby"] if method == "GET":
                return r.referenced_by(subject, version)
            case ["compatibility", "subjects", subject, "versions", *rest] if (
                method == "POST" and len(rest) <= 1
            ):
                messages = r.test_compatibility(subject, rest[0] if rest else None, self._body(), normalize)
                result: dict[str, Any] = {"is_compatible": not messages}
                if _flag(query, "verbose"):
                    result["messages"] = messages
                return result
            case ["config"] if method == "GET":
                return {"compatibilityLevel": r.compatibility(None)}
            case ["config"] if method == "PUT":
                return {"compatibility": r.set_compatibility(None, self._body())}
            case ["config"] if method == "DELETE":
                return {"compatibilityLevel": r.delete_compatibility(None)}
            case ["config", subject] if method == "GET":
                return {"compatibilityLevel": r.compatibility(subject, _flag(query, "defaultToGlobal"))}
            case ["config", subject] if method == "PUT":
                return {"compatibility": r.set_compatibility(subject, self._body())}
            case ["config", subject] if method == "DELETE":
                return {"compatibilityLevel": r.delete_compatibility(subject)}
            case ["mode"] if method == "GET":
                return {"mode": r.mode(None)}
            case ["mode"] if method == "PUT":
                return {"mode": r.set_mode(None, self._body(), _flag(query, "force"))}
            case ["mode", subject] if method == "GET":
                return {"mode": r.mode(subject, _flag(query, "defaultToGlobal"))}
            case ["mode", subject] if method == "PUT":
                return {"mode": r.set_mode(subject, self._body(), _flag(query, "force"))}
            case ["mode", subject] if method == "DELETE":
                return {"mode": r.delete_mode(subject)}
        if self._known(parts):
            raise errors.RegistryError(405, 405, "HTTP 405 Method Not Allowed")
        raise errors.RegistryError(404, 404, "HTTP 404 Not Found")

    def _signed_in(self) -> bool:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return bool(sep) and self.frontend.auth.check(user, password)

    def _unauthorized(self) -> None:
        body = json.dumps({"error_code": 401, "message": "Unauthorized"}).encode()
        self.send_response(401)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("WWW-Authenticate", 'Basic realm="SchemaRegistry"')
        self.end_headers()
        self.wfile.write(body)

    def _is_write(self, parts: list[str]) -> bool:
        if self.command in ("PUT", "DELETE"):
            return True
        return (
            self.command == "POST"
            and parts[:1] == ["subjects"]
            and len(parts) == 3
            and parts[2] == "versions"
        )

    def _forward(self, election: WriterElection) -> bool:
        """A write on a registry that is not the writer: relayed to the writer as it came, its answer relayed back.
        False when this registry became the writer meanwhile (the caller then serves the write itself)."""
        deadline = time.monotonic() + FORWARD_TIMEOUT
        while True:
            url = election.writer_url(timeout=max(0.0, deadline - time.monotonic()))
            if election.is_writer:
                return False
            if url is None:
                raise errors.RegistryError(500, 50004, "Leader not known.")
            req = urllib.request.Request(url + self.path, method=self.command, data=self._raw or None)
            for header in ("Content-Type", "Authorization", "Accept"):
                if self.headers.get(header):
                    req.add_header(header, self.headers[header])
            try:
                with urllib.request.urlopen(req, timeout=60, context=self.frontend.forward_context()) as resp:
                    status, body = resp.status, resp.read()
                break
            except urllib.error.HTTPError as e:
                status, body = e.code, e.read()
                break
            except OSError as e:
                # The writer's broker went away: its group session ends and the survivors elect another.
                if time.monotonic() >= deadline:
                    raise errors.RegistryError(
                        500, 50003, f"Error while forwarding the request to the leader: {e}"
                    ) from None
                election.wait_for_change(url, max(0.0, min(1.0, deadline - time.monotonic())))
        if status < 300:
            self.registry.store.catch_up()  # read-your-writes on this broker too
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    @staticmethod
    def _known(parts: list[str]) -> bool:
        return bool(parts) and parts[0] in ("subjects", "schemas", "config", "mode", "compatibility")


class RawSchema:
    """A /schema endpoint's answer: the schema text itself, not JSON-quoted."""

    def __init__(self, text: str) -> None:
        self.text = text
