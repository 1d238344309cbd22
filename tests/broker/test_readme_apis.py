"""The "Supported APIs" table of docs/apis.md says exactly what ApiVersions advertises.

Asked through kafka-python's protocol classes and through raw frames built with protocol.codec.
"""

from __future__ import annotations

import re

from tests.broker_process import ROOT
from tests.clients import KpRaw, RawClient


def supported_apis_section() -> str:
    text = (ROOT / "docs" / "apis.md").read_text()
    return text.split("# Supported APIs", 1)[1].split("\n## ", 1)[0]


def readme_api_table() -> dict[int, tuple[str, int, int]]:
    """api key -> (name, min version, max version) from the docs' table."""
    section = supported_apis_section()
    rows: dict[int, tuple[str, int, int]] = {}
    for name, key, lo, hi in re.findall(r"^\| (\w+) \| (\d+) \| (\d+)(?:-(\d+))?\b", section, re.M):
        assert int(key) not in rows, f"docs/apis.md lists api key {key} twice"
        rows[int(key)] = (name, int(lo), int(hi or lo))
    return rows


def test_readme_table_matches_api_versions_kafka_python(broker):
    from kafka.protocol.metadata.api_versions import ApiVersionsRequest

    with KpRaw(broker.bootstrap) as raw:
        resp = raw.send(ApiVersionsRequest[0]())
    assert resp.error_code == 0
    advertised = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    table = readme_api_table()
    assert {k: (lo, hi) for k, (_, lo, hi) in table.items()} == advertised


def test_readme_table_matches_api_versions_raw(broker):
    from kbroker.protocol.messages import ApiVersionsRequest

    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(18, 3, ApiVersionsRequest(client_software_name="readme-check",
                                                     client_software_version="1"))
    assert resp.error_code == 0
    advertised = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    table = readme_api_table()
    assert {k: (lo, hi) for k, (_, lo, hi) in table.items()} == advertised
    # The names are Kafka's (ApiKeys), so a reader can search for them.
    from kbroker.protocol import codec

    for key, (name, _, _) in table.items():
        assert codec.REQUESTS[key].__name__ == f"{name}Request", (key, name)


def test_readme_unsupported_list_does_not_contradict_quotas():
    section = supported_apis_section()
    not_supported = section.split("Not supported:", 1)[1].split("\n\n", 1)[0]
    # Byte-rate quotas per client id are supported (DescribeClientQuotas/AlterClientQuotas are advertised).
    assert not re.search(r"(^|[ ,])quotas\.?$", not_supported.strip(), re.M)
    assert "DescribeClientQuotas" in section and "AlterClientQuotas" in section
