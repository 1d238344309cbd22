"""mypy over the kbroker packages as installed names (kbroker.protocol, kbroker.storage, ...) from a checkout.

The repository keeps broker/, storage/, ... as top-level folders while code imports them as kbroker.*; mypy does not
run kbroker/__init__.py's path extension, so this links the folders under a temporary kbroker/ and checks there.
`python tools/typecheck.py` checks protocol and storage (the packages held to mypy); name others to add them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "console", "coordinator", "storage", "protocol", "schema_registry", "spark_jobs")
CHECKED = ("protocol", "storage")


def main(argv: list[str]) -> int:
    checked = argv or list(CHECKED)
    unknown = [name for name in checked if name not in PACKAGES]
    if unknown:
        print(f"error: not a kbroker package: {', '.join(unknown)} (one of {', '.join(PACKAGES)})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kbroker-typecheck-") as tmp:
        pkg = Path(tmp) / "kbroker"
        pkg.mkdir()
        shutil.copy(ROOT / "kbroker" / "__init__.py", pkg / "__init__.py")
        for name in PACKAGES:
            os.symlink(ROOT / name, pkg / name)
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(ROOT / ".mypy_cache")]
        for name in checked:
            cmd += ["-p", f"kbroker.{name}"]
        return subprocess.run(cmd, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
