"""Maven Central artifacts with their runtime dependencies, resolved once by Maven itself into the project's cache.

`python -m bench.peers.maven NAME GROUP:ARTIFACT:VERSION [...]` fetches a set and prints the folder of its jars. The
cache is KBROKER_CACHE (default ~/.cache/kbroker): maven/repository is Maven's local repository, maven/sets/NAME
holds one set's jars and a stamp that makes the next call free. Tests that need a set call `jars()` and skip with
the reason when it cannot be had (no Maven, no network), never silently.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kbroker.cache</groupId><artifactId>{name}</artifactId><version>0</version><packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""
DEPENDENCY = "    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>{c}</dependency>"


class ArtifactUnavailable(RuntimeError):
    """A set of artifacts could not be resolved here; the message says why (for a test's skip reason)."""


def cache_root() -> Path:
    return Path(os.environ.get("KBROKER_CACHE") or Path.home() / ".cache" / "kbroker")


def _dependency(coordinate: str) -> str:
    parts = coordinate.split(":")
    if len(parts) not in (3, 4):
        raise ValueError(f"not GROUP:ARTIFACT:VERSION[:CLASSIFIER]: {coordinate!r}")
    classifier = f"<classifier>{parts[3]}</classifier>" if len(parts) == 4 else ""
    return DEPENDENCY.format(g=parts[0], a=parts[1], v=parts[2], c=classifier)


def jars(name: str, coordinates: list[str], timeout: float = 900.0) -> Path:
    """The folder holding the jars of `coordinates` and everything they need at run time, fetched on first use."""
    key = hashlib.sha256("\n".join(sorted(coordinates)).encode()).hexdigest()[:16]
    target = cache_root() / "maven" / "sets" / name
    stamp = target / ".resolved"
    if stamp.is_file() and stamp.read_text() == key:
        return target / "lib"
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ArtifactUnavailable(f"{name}: no `mvn` on PATH to fetch {', '.join(coordinates)}")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    (target / "pom.xml").write_text(POM.format(name=name, dependencies="\n".join(map(_dependency, coordinates))))
    cmd = [mvn, "-B", "-q", "-f", str(target / "pom.xml"),
           f"-Dmaven.repo.local={cache_root() / 'maven' / 'repository'}",
           "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={target / 'lib'}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ArtifactUnavailable(f"{name}: Maven did not resolve {', '.join(coordinates)} within {timeout:.0f} s") \
            from None
    if r.returncode != 0:
        lines = [line for line in (r.stdout + r.stderr).splitlines() if "ERROR" in line] or ["(no error line)"]
        raise ArtifactUnavailable(f"{name}: Maven could not resolve {', '.join(coordinates)}: {lines[0][:300]}")
    stamp.write_text(key)
    return target / "lib"


def classpath(name: str, coordinates: list[str]) -> str:
    return os.pathsep.join(str(p) for p in sorted(jars(name, coordinates).glob("*.jar")))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m bench.peers.maven NAME GROUP:ARTIFACT:VERSION [...]", file=sys.stderr)
        return 2
    try:
        print(jars(argv[0], argv[1:]))
    except (ArtifactUnavailable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
