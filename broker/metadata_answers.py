"""Encoded Metadata answers, remembered while nothing they say can have changed (issue 34: Metadata is a hot API).

Clients send the same Metadata request again and again (librdkafka every topic.metadata.refresh.interval.ms and on
every leader change, the Java client on every metadata age-out), and building its answer (a message object per
topic and partition, then the encode) is three quarters of the request's CPU. An answer is remembered by the request
as it came (api version, the listener the connection came in on, the body's bytes: topic names or ids, the auto
creation flag, the authorized-operations flags) with the state it was built from: the store's `answer_state()`
(objects replaced, never changed in place, on every topic, partition state, broker registration or controller
change) and the advertised listeners. It is served only while that state is the same objects, so no change is ever
missed the way a forgotten counter bump would miss one.

Remembered only when the answer cannot depend on more than that: with an authorizer, per principal, host and ACL
generation (authorized operations and which topics are visible depend on them); no request quota (the body carries
its throttle: KafkaApis takes no direct path then), no offline partition on this broker (the log manager's set is
changed in place), no error in the answer (a missing topic may be created by the next request, a leaderless
partition may get a leader), and the state the same after the handler as before it (an auto-creation, or a change
made by another thread meanwhile).
KBROKER_METADATA_CACHE=0 turns it off (the differential tests compare both).
"""

from __future__ import annotations

import operator
import os
import struct
from typing import TYPE_CHECKING

from kbroker.protocol.messages import MetadataResponse

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

ENABLED = os.environ.get("KBROKER_METADATA_CACHE", "1") != "0"
# Distinct requests remembered at most: keys come from clients, so a client naming ever new topic lists must not
# grow the broker without bound. Real clients send a handful (their topic list, all topics).
MAX_ANSWERS = 256
_SIZE_AND_CORRELATION = struct.Struct(">ii")

# api version, listener name, request body, and with an authorizer (principal, host, ACL generation)
AnswerKey = tuple[int, str, bytes, tuple[str, str, int] | None]


def answer_state(server: KafkaServer) -> tuple[object, ...] | None:
    """The objects a Metadata answer is built from, or None when an answer may not be remembered at all."""
    if server.log_manager.offline_partitions:
        return None
    return (*server.metadata.answer_state(), server.config["advertised.listeners"])


def same_state(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """By identity: a replaced map that happens to be equal is a miss (rebuilt once), never a compare of maps."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


def error_free(body: MetadataResponse) -> bool:
    return all(t.error_code == 0 and all(p.error_code == 0 for p in t.partitions) for t in body.topics)


class MetadataAnswers:
    """Answers without their size and correlation id (the response header's tagged fields and the body), each with
    the state it was built from. Shared by the network threads: single dict operations only (atomic under the GIL),
    and every hit checks its own entry's state, so an entry put by a slower thread is only ever a miss."""

    __slots__ = ("_answers", "_last_state")

    def __init__(self) -> None:
        self._answers: dict[AnswerKey, tuple[tuple[object, ...], bytes]] = {}
        self._last_state: tuple[object, ...] = ()

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, key: AnswerKey, state: tuple[object, ...], correlation_id: int) -> bytearray | None:
        """The whole response frame for `correlation_id`, or None."""
        entry = self._answers.get(key)
        if entry is None or not same_state(entry[0], state):
            return None
        tail = entry[1]
        frame = bytearray(_SIZE_AND_CORRELATION.pack(len(tail) + 4, correlation_id))
        frame += tail
        return frame

    def put(self, key: AnswerKey, state: tuple[object, ...], frame: bytearray) -> None:
        """Remember an encoded response frame (size, correlation id, the rest) built from `state`."""
        if not same_state(state, self._last_state) or len(self._answers) >= MAX_ANSWERS:
            # Every entry of an older state is a miss from now on: dropped, so that they do not keep old topic maps.
            self._answers = {}
            self._last_state = state
        self._answers[key] = (state, bytes(frame[8:]))
