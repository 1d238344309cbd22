"""`python -m kbroker_tools.healthcheck [HOST:PORT]`: exit 0 when the broker answers ApiVersions without error.

The container HEALTHCHECK: a real protocol round trip, so a process that accepts connections but cannot serve
requests is unhealthy."""

from __future__ import annotations

import sys

from kbroker_tools.wire import WireClient


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    bootstrap = args[0] if args else "127.0.0.1:9092"
    try:
        with WireClient(bootstrap, timeout=5.0, client_id="kbroker-healthcheck") as c:
            resp = c.api_versions()
    except (OSError, ConnectionError) as e:
        print(f"unhealthy: {bootstrap}: {e}", file=sys.stderr)
        return 1
    if resp.error_code:
        print(f"unhealthy: {bootstrap}: ApiVersions error {resp.error_code}", file=sys.stderr)
        return 1
    print(f"healthy: {bootstrap} serves {len(resp.api_keys)} APIs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
