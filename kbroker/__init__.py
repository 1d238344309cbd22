"""kbroker: a standalone Kafka-compatible broker. Its packages install as kbroker.broker, kbroker.coordinator,
kbroker.storage, kbroker.protocol, kbroker.console, kbroker.schema_registry and kbroker.spark_jobs, so a user's site-packages gains no generic top-level name.

In the repository those packages stay top-level folders beside this one (pyproject.toml maps them for the wheel);
a checkout run without installing finds them there too, through the path below.
"""

from __future__ import annotations

import os

_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Only a source checkout has pyproject.toml beside the packages; an installed kbroker has them inside this folder.
if os.path.isfile(os.path.join(_checkout, "pyproject.toml")) and os.path.isdir(os.path.join(_checkout, "broker")):
    __path__.append(_checkout)  # type: ignore[name-defined]  # noqa: F821
