"""Spark's Kafka connector (spark-sql-kafka-0-10) resolved once by Spark's own Ivy into the project's cache.

    python -m kbroker.spark_jobs.connector fetch     # resolve and cache; prints the coordinates it settled on

The connector version should match the installed pyspark, but a new pyspark can come out before its connector is
published: the pyspark version is tried first, then the newest release of each older 4.x line down to 4.2 (the
connector 4.2.0 runs under pyspark 4.3.0). The version that resolved is written next to the Ivy cache, so later
starts name an exact version that Ivy finds in its cache without going to the network.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
OLDEST_LINE = (4, 2)
# pyspark ships the Hadoop client the connector depends on: excluding it saves ~50 MB of download and a second copy
# of the same classes on the classpath.
EXCLUDES = "org.apache.hadoop:hadoop-client-runtime,org.apache.hadoop:hadoop-client-api"
FETCH_TIMEOUT = 600.0


class ConnectorUnavailable(RuntimeError):
    """No candidate version of the connector could be resolved: the message says which were tried and why."""


def ivy_dir() -> Path:
    """spark.jars.ivy: Ivy's cache and the resolved jars, under KBROKER_CACHE (default ~/.cache/kbroker)."""
    base = os.environ.get("KBROKER_CACHE") or str(Path.home() / ".cache" / "kbroker")
    return Path(base) / "ivy"


def pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def candidates(version: str) -> list[str]:
    """Connector versions to try for pyspark `version`: that version, then each older 4.x line's newest."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        return [version]
    major, minor = int(m.group(1)), int(m.group(2))
    out = [version]
    for line in range(minor - 1, -1, -1):
        if (major, line) < OLDEST_LINE:
            break
        out.append(f"{major}.{line}.+")
    return out


def _marker(version: str) -> Path:
    return ivy_dir() / f"kbroker-connector-for-pyspark-{version}"


def resolved(version: str | None = None) -> str | None:
    """The coordinates fetched earlier for this pyspark version, if their jar is still in the cache."""
    version = version or pyspark_version()
    try:
        coord = _marker(version).read_text().strip()
    except OSError:
        return None
    jar = ivy_dir() / "jars" / f"{coord.replace(':', '_', 1).replace(':', '-')}.jar"
    return coord if coord.startswith(ARTIFACT + ":") and jar.is_file() else None


def spark_submit() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return str(Path(_find_spark_home()) / "bin" / "spark-submit")


def _try(coord: str, timeout: float) -> tuple[str | None, str]:
    """Resolve one coordinate with spark-submit --packages (no job runs); (exact coordinates, log tail)."""
    with tempfile.TemporaryDirectory(prefix="kbroker-connector-") as tmp:
        noop = Path(tmp) / "noop.py"
        noop.write_text("")
        env = dict(
            os.environ,
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        )
        args = [spark_submit(), "--master", "local[1]", "--conf", f"spark.jars.ivy={ivy_dir()}"]
        args += ["--packages", coord, "--exclude-packages", EXCLUDES, str(noop)]
        try:
            proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired:
            return None, f"{coord}: no answer within {timeout:.0f} s"
    group, name = ARTIFACT.split(":")
    found = re.search(rf"found {re.escape(group)}#{re.escape(name)};(\S+) in", proc.stdout + proc.stderr)
    if proc.returncode != 0 or not found:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines()]
        # Ivy's access error says why (network refused, not found); the repository address adds nothing.
        why = [ln for ln in lines if "Exception" in ln] + [
            ln for ln in lines if "unresolved dependency" in ln
        ]
        reason = re.sub(r"\s*at url \S+", "", why[0]) if why else f"spark-submit exited {proc.returncode}"
        return None, f"{coord}: {reason}"
    return f"{ARTIFACT}:{found.group(1)}", ""


def fetch(version: str | None = None, timeout: float = FETCH_TIMEOUT, refresh: bool = False) -> str:
    """Coordinates of a connector that Spark can load with spark.jars.packages + spark.jars.ivy=ivy_dir().

    Resolves (and downloads) once; afterwards answers from the marker file. Raises ConnectorUnavailable."""
    version = version or pyspark_version()
    if not refresh and (coord := resolved(version)):
        return coord
    ivy_dir().mkdir(parents=True, exist_ok=True)
    # Two processes resolving into one Ivy cache at once (pytest workers, parallel jobs) can corrupt it: one at a
    # time, and a process that waited finds the other's answer.
    with open(ivy_dir() / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not refresh and (coord := resolved(version)):
            return coord
        tried: list[str] = []
        for cand in candidates(version):
            coord, why = _try(f"{ARTIFACT}:{cand}", timeout)
            if coord:
                _marker(version).write_text(coord + "\n")
                return coord
            tried.append(why)
    raise ConnectorUnavailable(
        f"Spark's Kafka connector for pyspark {version} could not be resolved: {'; '.join(tried)}"
    )


def spark_conf(coord: str) -> dict[str, str]:
    """The session settings that load the connector `coord` from the project's Ivy cache."""
    return {"spark.jars.packages": coord, "spark.jars.excludes": EXCLUDES, "spark.jars.ivy": str(ivy_dir())}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m kbroker.spark_jobs.connector", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("command", choices=("fetch",))
    p.add_argument(
        "--refresh", action="store_true", help="resolve again even if a version was fetched before"
    )
    p.add_argument("--timeout", type=float, default=FETCH_TIMEOUT, help="seconds per version tried")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    try:
        coord = fetch(timeout=a.timeout, refresh=a.refresh)
    except ConnectorUnavailable as e:
        print(f"connector: {e}", file=sys.stderr)
        return 1
    print(f"{coord} (pyspark {pyspark_version()}, Ivy cache {ivy_dir()}, {time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
