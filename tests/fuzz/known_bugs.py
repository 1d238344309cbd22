"""Broker bugs the fuzzers found in code outside tests/fuzz's remit, reported to their owners.

The fuzzers tolerate a logged traceback that matches one of these (the connection is closed, the broker
keeps serving); each has an xfail(strict) regression test in test_regressions.py. When a fix lands the
regression test XPASSes and fails: delete it from here and drop the xfail there."""

from __future__ import annotations

import re

KNOWN_BUGS: list[re.Pattern[str]] = [
]
