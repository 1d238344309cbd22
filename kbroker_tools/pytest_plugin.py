"""pytest plugin (entry point `pytest11`): a real kbroker for the tests of any project that uses Kafka.

Fixtures:
- `kafka_broker` (session): a kbroker on a free 127.0.0.1 port with its data in a temporary directory, stopped
  and removed after the session. `bootstrap_servers`, `create_topic(name, partitions, config)`, `restart()`,
  `kill()` (SIGKILL, for crash tests), `start_seconds`. Under pytest-xdist each worker gets its own broker.
- `kafka_topic` (function): a new topic per test; `@pytest.mark.kafka_topic(partitions=3, config={...})` shapes it.
- `schema_registry_url` (session): the URL of the broker's schema registry (Confluent's REST API), turned on for
  the session's broker when a collected test asks for this fixture (needs `pip install 'kbroker[registry]'`).

Options (command line, or the ini key of the same name with underscores):
- `--kbroker-override KEY=VALUE` / `kbroker_overrides` (one per line): broker config, Kafka's server.properties keys.
- `--kbroker-in-process` / `kbroker_in_process = true`: run the broker on a thread of the test process instead
  of a subprocess (faster to start; `kill()` is unavailable there, since a thread cannot crash like a process).

The broker is driven through its command line or its server object and reached over the Kafka protocol only.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

# kbroker_tools.wire (and the protocol codec behind it) is imported when a fixture first needs it: a plugin that
# every pytest run of the environment loads must not make runs that never use the broker slower to start.

# Test-sized defaults (a user's --kbroker-override wins): consumer groups form at once and the internal topics
# are created with few partitions, so the first group or transaction of a session does not create 50 logs.
DEFAULTS = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "4",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "num.network.threads": "1",
    "num.io.threads": "2",
    "log.cleaner.backoff.ms": "1000",
}

_topic_counter = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _broker_import_root() -> str:
    """The directory `python -m kbroker.broker` must run from to get the same broker this process would import."""
    spec = find_spec("kbroker")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the kbroker package is not importable")
    return str(Path(next(iter(spec.submodule_search_locations))).parent)


class KafkaBroker:
    """One kbroker, in a subprocess (default) or on a thread of this process (in_process=True)."""

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None, in_process: bool = False,
                 start_timeout: float = 30.0) -> None:
        self.data_dir = Path(data_dir)
        self.port = _free_port()
        self.in_process = in_process
        self.start_timeout = start_timeout
        self.overrides = {
            **DEFAULTS,
            **(overrides or {}),
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": str(self.data_dir / "logs"),
        }
        self.schema_registry_url: str | None = None
        listener = self.overrides.get("schema.registry.listeners")
        if listener:
            self.schema_registry_url = listener.rstrip("/")
        self.start_seconds = 0.0  # how long the last start took, until the broker answered ApiVersions
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._stop_inline: Any = None
        self._inline_error: BaseException | None = None
        self.log_path = self.data_dir / "broker.log"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> KafkaBroker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        if self.in_process:
            self._start_inline()
        else:
            self._start_process()
        self._wait_ready(t0 + self.start_timeout)
        self.start_seconds = time.monotonic() - t0
        return self

    def _start_process(self) -> None:
        props = self.data_dir / "server.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in self.overrides.items()))
        with open(self.log_path, "ab") as logf:
            self._proc = subprocess.Popen([sys.executable, "-m", "kbroker.broker", str(props)], cwd=_broker_import_root(),
                                          stdout=logf, stderr=subprocess.STDOUT)

    def _start_inline(self) -> None:
        import asyncio

        import uvloop
        from kbroker.broker.config import KafkaConfig
        from kbroker.broker.server import KafkaServer

        server = KafkaServer(KafkaConfig(dict(self.overrides)))
        started = threading.Event()
        self._inline_error = None

        async def serve() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            self._stop_inline = lambda: loop.call_soon_threadsafe(stop.set)
            try:
                await server.startup()
            finally:
                started.set()
            await stop.wait()
            await server.shutdown()

        def run() -> None:
            try:
                uvloop.run(serve())
            except BaseException as e:  # noqa: BLE001 - reported by start() / stop() in the test's thread
                self._inline_error = e
                started.set()

        self._thread = threading.Thread(target=run, name=f"kbroker-{self.port}", daemon=True)
        self._thread.start()
        started.wait(self.start_timeout)
        if self._inline_error is not None:
            raise RuntimeError(f"kbroker failed to start in-process: {self._inline_error!r}")

    def _wait_ready(self, deadline: float) -> None:
        from kbroker_tools.wire import WireClient

        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"kbroker exited with {self._proc.returncode}:\n{self.read_log()[-4000:]}")
            try:
                with WireClient(self.bootstrap_servers, timeout=2.0) as c:
                    if c.api_versions().error_code == 0 and self._registry_listening():
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill() if self._proc is not None else self.stop()
                raise RuntimeError(f"kbroker did not answer within {self.start_timeout} s:\n{self.read_log()[-4000:]}")
            time.sleep(0.01)

    def _registry_listening(self) -> bool:
        """The registry's HTTP port binds just after the Kafka listeners."""
        if self.schema_registry_url is None:
            return True
        host, _, port = self.schema_registry_url.rsplit("/", 1)[-1].rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=1.0):
                return True
        except OSError:
            return False

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        if self.in_process:
            return self._thread is not None and self._thread.is_alive()
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM for the subprocess)."""
        if self._thread is not None:
            if self._stop_inline is not None:
                self._stop_inline()
            self._thread.join(timeout)
            self._thread, self._stop_inline = None, None
            return
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush; `restart()` then recovers the data directory like after a crash."""
        if self.in_process:
            raise RuntimeError("kill() needs the subprocess broker: a thread cannot be killed like a process "
                               "(drop --kbroker-in-process for crash tests)")
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None

    def restart(self) -> KafkaBroker:
        """Stop (cleanly, unless already killed) and start again on the same port with the same data."""
        self.stop()
        return self.start()

    # ------------------------------------------------------------ topics

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> str:
        from kbroker_tools.wire import TOPIC_ALREADY_EXISTS, WireClient, WireError

        with WireClient(self.bootstrap_servers, client_id="kbroker-pytest") as c:
            try:
                c.create_topic(name, partitions, {k: str(v) for k, v in (config or {}).items()})
            except WireError as e:
                if e.code != TOPIC_ALREADY_EXISTS:
                    raise
        return name


# ---------------------------------------------------------------- pytest hooks and fixtures


def _leave_kbroker_unrewritten(pluginmanager: pytest.PytestPluginManager) -> None:
    """Keep pytest's assertion rewriting off kbroker's own modules (the broker holds no test asserts).

    pytest marks every top-level package of a distribution that declares a pytest11 entry point for rewriting, so
    the in-process broker's imports would each be parsed, rewritten and compiled again, with no cache where bytecode
    cannot be written (PYTHONDONTWRITEBYTECODE): 1-1.5 s for the generated protocol module alone. pytest offers no
    public way to unmark a package, so this drops the two names from its hook's set while nothing is imported yet.
    """
    hook = getattr(pluginmanager, "rewrite_hook", None)
    marked = getattr(hook, "_must_rewrite", None)
    if isinstance(marked, set) and marked & {"kbroker", "kbroker_tools"}:
        marked.difference_update({"kbroker", "kbroker_tools"})
        cache = getattr(hook, "_marked_for_rewrite_cache", None)
        if isinstance(cache, dict):
            cache.clear()


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    _leave_kbroker_unrewritten(pluginmanager)
    group = parser.getgroup("kbroker", "kbroker broker for the kafka_broker fixture")
    group.addoption("--kbroker-override", action="append", default=[], metavar="KEY=VALUE",
                    help="broker config for the kafka_broker fixture (Kafka's server.properties keys)")
    group.addoption("--kbroker-in-process", action="store_true", default=None,
                    help="run the kafka_broker fixture's broker on a thread of the test process")
    parser.addini("kbroker_overrides", "broker config for the kafka_broker fixture, KEY=VALUE per line",
                  type="linelist", default=[])
    parser.addini("kbroker_in_process", "run the kafka_broker fixture's broker in the test process",
                  type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kafka_topic(partitions=1, config=None): shape the kafka_topic fixture")


def _overrides(config: pytest.Config) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in [*config.getini("kbroker_overrides"), *config.getoption("kbroker_override")]:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise pytest.UsageError(f"kbroker override {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


_STARTS: list[tuple[str, float]] = []
_WANTS_REGISTRY = pytest.StashKey[bool]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The session's broker is started once: it serves a schema registry only for a run whose tests ask for one.
    config.stash[_WANTS_REGISTRY] = any("schema_registry_url" in getattr(i, "fixturenames", ()) for i in items)


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[KafkaBroker]:
    config = request.config
    in_process = config.getoption("kbroker_in_process")
    if in_process is None:
        in_process = config.getini("kbroker_in_process")
    data_dir = Path(tempfile.mkdtemp(prefix="kbroker-pytest-"))
    overrides = _overrides(config)
    if config.stash.get(_WANTS_REGISTRY, False) and not overrides.get("schema.registry.listeners"):
        overrides["schema.registry.listeners"] = f"http://127.0.0.1:{_free_port()}"
    broker = KafkaBroker(data_dir, overrides, in_process=bool(in_process))
    try:
        broker.start()
        _STARTS.append(("in-process" if broker.in_process else "subprocess", broker.start_seconds))
        yield broker
    finally:
        try:
            broker.stop()
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def schema_registry_url(kafka_broker: KafkaBroker) -> str:
    if kafka_broker.schema_registry_url is None:
        raise pytest.UsageError("schema_registry_url: the session's broker has no schema.registry.listeners")
    return kafka_broker.schema_registry_url


@pytest.fixture
def kafka_topic(kafka_broker: KafkaBroker, request: pytest.FixtureRequest) -> str:
    marker = request.node.get_closest_marker("kafka_topic")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    base = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:120]
    name = f"{base}-{next(_topic_counter)}"
    return kafka_broker.create_topic(name, int(kwargs.get("partitions", 1)), kwargs.get("config"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller prints the start times
        workeroutput["kbroker_starts"] = list(_STARTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    _STARTS.extend(tuple(x) for x in getattr(node, "workeroutput", {}).get("kbroker_starts", []))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for mode, seconds in _STARTS:
        terminalreporter.write_line(
            f"kbroker: the kafka_broker fixture's broker ({mode}) answered in {seconds:.2f} s "
            "(a JVM Kafka in a Docker container, as testcontainers starts it, typically needs 5-15 s)"
        )
