"""Minimal examples of the bugs the fuzzers found, replayed against a real broker.

Bugs fixed in protocol/ or storage/ are plain tests; bugs outside tests/fuzz's remit (reported to their
owners, listed in known_bugs.py) are xfail(strict=True), so the fix makes them fail until the xfail goes."""

from __future__ import annotations

import pytest
from kbroker.protocol.messages import MetadataRequest

from tests.broker_process import BrokerProcess
from tests.fuzz.common import Raw, round_trip


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_null_topic_name_before_v12(fuzz_broker: BrokerProcess, version: int) -> None:
    # Found by test_request_frames: MetadataRequest v11, topics=[{topic_id: zero uuid, name: null}].
    req = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(topic_id=bytes(16), name=None)],
                          allow_auto_topic_creation=False)
    with Raw(fuzz_broker.bootstrap) as raw:
        resp = raw.request(3, version, req)
    assert resp.topics[0].error_code == 42  # INVALID_REQUEST, as Kafka
    round_trip(fuzz_broker.bootstrap)
