"""The built wheel: one import namespace in site-packages, and the pytest plugin inside a user's project."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.broker_process import ROOT

USER_TEST = '''
import sys

import storage  # the user's own module: kbroker must neither shadow it nor be shadowed by it
from confluent_kafka import Consumer, Producer


def test_user_module_and_broker(kafka_broker, kafka_topic):
    assert storage.OWNER == "user"
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    p.produce(kafka_topic, b"hello"); p.flush(10)
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "g",
                  "auto.offset.reset": "earliest"})
    c.subscribe([kafka_topic])
    msg = c.poll(30)
    c.close()
    assert msg is not None and msg.value() == b"hello"
    messages = sys.modules["kbroker.protocol.messages"]
    assert messages.__file__.startswith("{target}"), messages.__file__
    # pytest's assertion rewriting stays off kbroker's modules: imported by the ordinary loader.
    assert type(messages.__loader__).__name__ != "AssertionRewritingHook", type(messages.__loader__)
'''


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = out.glob("kbroker-*.whl")
    return whl


def test_wheel_installs_only_the_kbroker_namespace(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        top = {name.split("/")[0] for name in z.namelist()}
        names = z.namelist()
    assert {t for t in top if not t.endswith(".dist-info")} == {"kbroker", "kbroker_tools"}, top
    assert "kbroker/broker/server.py" in names and "kbroker/protocol/messages.py" in names
    assert "kbroker/broker/handlers/__init__.py" in names  # subpackages follow their top-level folder


def test_plugin_in_a_user_project_with_its_own_storage_module(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    project = tmp_path / "project"
    project.mkdir()
    (project / "storage.py").write_text('OWNER = "user"\n')
    (project / "test_user.py").write_text(USER_TEST.replace("{target}", str(target)))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_XDIST_") and k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    env.update(PYTHONPATH=str(target), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kbroker-in-process"],
                       cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout, r.stdout[-3000:]
