"""The Java client's replay sessions: java/ReplaySession.java compiled once against kafka-clients 3.9 from the
Maven cache (Kafka 3.9's own jar set) and run in a JVM per session."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from tests.differential.sessions import SessionUnavailable

SOURCE = Path(__file__).resolve().parent / "java" / "ReplaySession.java"
# kafka-clients and what it loads at run time; slf4j-simple logs the client's warnings to stderr
CLIENT_JARS = ("kafka-clients-", "lz4-java-", "snappy-java-", "zstd-jni-", "slf4j-api-", "slf4j-simple-")
JAVA_TIMEOUT = 120.0


@functools.cache
def classpath() -> str:
    """ReplaySession's classes (compiled into the cache, keyed by the source and the jars) and the client jars."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        raise SessionUnavailable("javac/java not on PATH (install a JDK, e.g. openjdk-17-jdk-headless)")
    from bench.peers.kafka import fetch
    from bench.peers.maven import ArtifactUnavailable, cache_root

    try:
        lib = fetch("3.9")
    except ArtifactUnavailable as e:
        raise SessionUnavailable(f"kafka-clients 3.9 cannot be had: {e}") from None
    jars = sorted(str(p) for p in lib.glob("*.jar") if p.name.startswith(CLIENT_JARS))
    key = hashlib.sha256(SOURCE.read_bytes() + "\n".join(jars).encode()).hexdigest()[:16]
    out = cache_root() / "differential-java" / key
    if not (out / "ReplaySession.class").is_file():
        tmp = out.with_name(f"{key}.{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            ["javac", "-d", str(tmp), "-cp", os.pathsep.join(jars), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise RuntimeError(f"javac failed:\n{r.stdout}\n{r.stderr}")
        if out.exists():  # compiled meanwhile by another process
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(out)
    return os.pathsep.join([str(out), *jars])


def run(bootstrap: str, scenario: str, tag: str) -> None:
    cmd = [
        "java",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        classpath(),
        "ReplaySession",
        bootstrap,
        scenario,
        tag,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=JAVA_TIMEOUT)
    if r.returncode != 0 or r.stdout.splitlines()[-1:] != [f"DONE {scenario}"]:
        raise RuntimeError(
            f"Java session {scenario} exited {r.returncode}\n--- stdout:\n{r.stdout[-6000:]}\n"
            f"--- stderr:\n{r.stderr[-6000:]}"
        )


def idempotent(bootstrap: str, tag: str) -> None:
    run(bootstrap, "idempotent", tag)


def group(bootstrap: str, tag: str) -> None:
    run(bootstrap, "group", tag)


def transaction(bootstrap: str, tag: str) -> None:
    run(bootstrap, "transaction", tag)


def admin(bootstrap: str, tag: str) -> None:
    run(bootstrap, "admin", tag)
