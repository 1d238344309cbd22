"""The console's HTTP server at console.listeners: static pages, a JSON API over ClusterView, HTTP basic auth.

Concurrency model: http.server's threads, one per browser connection, each asking the broker over its own
loopback Kafka connection (one per signed-in user, serialised inside ClusterView). Nothing here touches the
broker's loops or locks: the console is a client that happens to live in the broker's process.

Users: when the listener the console connects through has SASL, every request needs HTTP basic auth with a SASL
user of that listener (PLAIN or SCRAM), and the broker's authorizer decides what that user may see and do; on a
listener without SASL everyone is the listener's principal (User:ANONYMOUS on PLAINTEXT).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from kbroker.broker.config import CONSOLE_LISTENER
from kbroker.console.cluster import ClusterView, ConsoleError
from kbroker.console.history import History
from kbroker.console.schemas import WireFormatDecoder

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

log = logging.getLogger("kbroker.console")

LISTENER_PREFERENCE = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
MECHANISM_PREFERENCE = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
STATIC = {"/": ("index.html", "text/html; charset=utf-8"), "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/style.css": ("style.css", "text/css; charset=utf-8")}


def parse_console_listener(value: str) -> tuple[str, int]:
    m = CONSOLE_LISTENER.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"console.listeners: expected http://HOST:PORT, got {value!r}")
    return m.group(1).strip("[]"), int(m.group(2))


class Unauthorized(Exception):
    """No or wrong credentials for a console that needs them."""


class ConsoleServer:
    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self.host, self.port = parse_console_listener(server.config["console.listeners"])
        self.listener, self.protocol = self._kafka_listener()
        self.needs_login = self.protocol.startswith("SASL_")
        self.mechanisms = [m for m in MECHANISM_PREFERENCE
                           if m in server.config.for_listener(self.listener, "sasl.enabled.mechanisms")]
        self._views: dict[tuple[str, str], ClusterView] = {}
        self._views_lock = threading.Lock()
        self.history = History(self._sampled_lags if not self.needs_login else None)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def _kafka_listener(self) -> tuple[str, str]:
        config = self.server.config
        names = {listener.name: config.security_protocol(listener.name) for listener in config.listeners}
        for protocol in LISTENER_PREFERENCE:
            for name, p in names.items():
                if p == protocol:
                    return name, p
        raise ValueError("console.listeners: the broker has no listener the console can connect through")

    def start(self) -> None:
        console = self

        class Handler(ConsoleHandler):
            pass

        Handler.console = console
        try:
            self._httpd = ThreadingHTTPServer((self.host, self.port), Handler)
        except OSError as e:
            raise OSError(e.errno, f"cannot bind console.listeners to {self.host}:{self.port}: {e.strerror}") from None
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="kbroker-console", daemon=True)
        self._thread.start()
        self.history.start()
        log.info("Serving the web console on http://%s:%d/ (through listener %s, %s)", self.host, self.port,
                 self.listener, "HTTP basic auth with the listener's SASL users" if self.needs_login
                 else "no sign-in: the listener has no SASL")

    def stop(self) -> None:
        self.history.stop()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._views_lock:
            views, self._views = list(self._views.values()), {}
        for v in views:
            v.close()

    # ------------------------------------------------------------ connections to the broker

    def _address(self) -> tuple[str, int]:
        host, port = self.server.socket_server.bound[self.listener]
        return ("127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host), port

    def _connect(self, user: str, password: str) -> ClusterView:
        from kbroker_tools.wire import WireClient, WireError

        context = None
        if self.protocol.endswith("SSL"):
            # The console's own broker on loopback: the connection never leaves this host.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        host, port = self._address()
        client = WireClient(f"[{host}]:{port}" if ":" in host else f"{host}:{port}", timeout=30,
                            client_id="kbroker-console", ssl_context=context)
        try:
            if self.needs_login:
                last: Exception | None = None
                for mechanism in self.mechanisms:
                    try:
                        client.authenticate(mechanism, user, password)
                        break
                    except WireError as e:
                        last = e
                        client.close()
                        client = WireClient(f"{host}:{port}", timeout=30, client_id="kbroker-console",
                                            ssl_context=context)
                else:
                    client.close()
                    raise Unauthorized(str(last) if last else "the listener has no PLAIN or SCRAM mechanism")
        except BaseException:
            client.close()
            raise
        registry = self.server.schema_registry.registry if self.server.schema_registry is not None else None
        return ClusterView(client, WireFormatDecoder(registry))

    def view(self, user: str, password: str) -> ClusterView:
        key = (user, hashlib.sha256(password.encode()).hexdigest())
        with self._views_lock:
            v = self._views.get(key)
            if v is not None and v.broken:
                del self._views[key]
                v.close()
                v = None
        if v is None:
            v = self._connect(user, password)
            with self._views_lock:
                self._views[key] = v
        return v

    def forget(self, user: str, password: str) -> None:
        key = (user, hashlib.sha256(password.encode()).hexdigest())
        with self._views_lock:
            v = self._views.pop(key, None)
        if v is not None:
            v.close()

    def _sampled_lags(self) -> dict[str, int]:
        return {g["group_id"]: g["lag"] for g in self.view("", "").groups()["groups"]}


class ConsoleHandler(BaseHTTPRequestHandler):
    console: ConsoleServer
    server_version = "kbroker-console"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (http.server's signature)
        log.debug("%s %s", self.address_string(), format % args)

    # ------------------------------------------------------------ plumbing

    def _send(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _credentials(self) -> tuple[str, str]:
        if not self.console.needs_login:
            return "", ""
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            raise Unauthorized("sign in with a SASL user of this broker")
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise Unauthorized("malformed Authorization header") from None
        return user, password

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= 1 << 20:
            raise ConsoleError(413, "request body too large")
        try:
            return json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            raise ConsoleError(400, "the request body is not JSON") from None

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        if self.command in ("GET", "HEAD") and url.path in STATIC:
            name, content_type = STATIC[url.path]
            body = resources.files("kbroker.console").joinpath("static", name).read_bytes()
            self._send(200, body, content_type)
            return
        if not url.path.startswith("/api/"):
            self._json(404, {"error": f"no page {url.path}"})
            return
        user, password = "", ""
        try:
            user, password = self._credentials()
            view = self.console.view(user, password)
            self._json(200, self._api(view, user, [unquote(p) for p in url.path[5:].split("/")],
                                      parse_qs(url.query)))
        except Unauthorized as e:
            self._send(401, json.dumps({"error": str(e)}).encode(), "application/json",
                       {"WWW-Authenticate": 'Basic realm="kbroker console", charset="UTF-8"'})
        except ConsoleError as e:
            self._json(e.status, {"error": str(e)})
        except (OSError, ConnectionError) as e:
            self.console.forget(user, password)  # a broken connection is replaced on the next request
            self._json(503, {"error": f"the broker did not answer: {e}"})
        except Exception as e:  # a console bug must not take the broker down: log it, answer 500
            log.exception("console request %s %s failed", self.command, self.path)
            self._json(500, {"error": f"{type(e).__name__}: {e}"})

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    # ------------------------------------------------------------ routes

    def _query_int(self, query: dict[str, list[str]], name: str) -> int | None:
        if name not in query:
            return None
        try:
            return int(query[name][0])
        except ValueError:
            raise ConsoleError(400, f"{name} must be a whole number") from None

    def _api(self, view: ClusterView, user: str, parts: list[str], query: dict[str, list[str]]) -> Any:
        method = self.command
        match parts:
            case ["whoami"]:
                return {"user": user or None, "login_required": self.console.needs_login,
                        "listener": self.console.listener}
            case ["brokers"] if method == "GET":
                return view.brokers()
            case ["topics"] if method == "GET":
                return view.topics()
            case ["topics"] if method == "POST":
                return view.create_topic(self._body())
            case ["topics", name] if method == "GET":
                return view.topic(name)
            case ["topics", name] if method == "DELETE":
                return view.delete_topic(name)
            case ["topics", name, "messages"] if method == "GET":
                partition = self._query_int(query, "partition") or 0
                return view.messages(name, partition, offset=self._query_int(query, "offset"),
                                     timestamp=self._query_int(query, "timestamp"),
                                     limit=self._query_int(query, "limit") or 50)
            case ["topics", name, "producers"] if method == "GET":
                return view.producers(name)
            case ["groups"] if method == "GET":
                groups = view.groups()
                if self.console.needs_login:  # no sampler can sign in: the pages viewed fill the charts
                    for g in groups["groups"]:
                        self.console.history.record_lag(g["group_id"], g["lag"])
                return groups
            case ["groups", group_id] if method == "GET":
                group = view.group(group_id)
                if self.console.needs_login:
                    self.console.history.record_lag(group_id, sum(p["lag"] or 0 for p in group["offsets"]))
                group["lag_history"] = self.console.history.lag(group_id)
                return group
            case ["transactions"] if method == "GET":
                return view.transactions()
            case ["throughput"] if method == "GET":
                return self.console.history.throughput()
        raise ConsoleError(404 if method in ("GET", "HEAD") else 405, f"no API {method} /api/{'/'.join(parts)}")
