"""The writer election among several brokers' registries, as the reference registry does it: every registry joins
the Kafka group `schema-registry` (protocol type "sr") with its identity as member metadata; the group's leader
names one writer in the assignment, and the others forward their writes to it over HTTP.

Concurrency model: one thread owns the coordinator connection (join, sync, heartbeats); `writer` is replaced
whole, so HTTP threads read it without a lock and wait on `elected` while a rebalance is under way.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    SyncGroupRequest,
)

log = logging.getLogger("kbroker.schema_registry")

FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 10, 11, 12, 13, 14
GROUP_ID, PROTOCOL_TYPE, PROTOCOL = "schema-registry", "sr", "v0"
SESSION_TIMEOUT_MS, HEARTBEAT_INTERVAL_S = 10000, 1.0
REJOIN = {
    ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.UNKNOWN_MEMBER_ID,
    ErrorCode.ILLEGAL_GENERATION,
    ErrorCode.FENCED_INSTANCE_ID,
}


def identity_url(identity: dict[str, Any]) -> str:
    host = str(identity.get("host"))
    return f"{identity.get('scheme', 'http')}://{f'[{host}]' if ':' in host else host}:{identity.get('port')}"


class WriterElection:
    def __init__(
        self, bootstrap: tuple[str, int], connect: Callable[[str, int], Any], identity: dict[str, Any]
    ) -> None:
        self.bootstrap = bootstrap
        self.connect = connect
        self.identity = identity
        self.member_id = ""
        self.generation = -1
        self.writer: dict[str, Any] | None = None
        self.elected = threading.Event()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="kbroker-schema-registry-election", daemon=True
        )

    @property
    def is_writer(self) -> bool:
        return self.writer is not None and identity_url(self.writer) == identity_url(self.identity)

    def writer_url(self, timeout: float) -> str | None:
        """The elected writer's URL, waiting up to `timeout` for an election under way; None if there is none."""
        self.elected.wait(timeout)
        writer = self.writer
        return None if writer is None else identity_url(writer)

    def wait_for_change(self, url: str, timeout: float) -> None:
        """Until the writer is another than `url` (or timeout)."""
        with self._changed:
            self._changed.wait_for(lambda: self.writer is None or identity_url(self.writer) != url, timeout)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)

    def _connect(self, host: str, port: int) -> Any:
        return self.connect(host, port)

    def _coordinator(self):  # type: ignore[no-untyped-def]
        with self._connect(*self.bootstrap) as c:
            resp = c.request(
                FIND_COORDINATOR, 3, FindCoordinatorRequest(key=GROUP_ID, key_type=0, coordinator_keys=[])
            )
        if resp.error_code:
            raise ConnectionError(f"FindCoordinator: {ErrorCode(resp.error_code).name}")
        return self._connect(resp.host, resp.port)

    def _run(self) -> None:
        client = None
        backoff = 0.2
        while not self._stopping.is_set():
            try:
                if client is None:
                    client = self._coordinator()
                self._join(client)
                backoff = 0.2
                while not self._stopping.wait(HEARTBEAT_INTERVAL_S):
                    resp = client.request(
                        HEARTBEAT,
                        3,
                        HeartbeatRequest(
                            group_id=GROUP_ID,
                            generation_id=self.generation,
                            member_id=self.member_id,
                            group_instance_id=None,
                        ),
                    )
                    if resp.error_code in REJOIN:
                        if resp.error_code != ErrorCode.REBALANCE_IN_PROGRESS:
                            self.member_id = ""
                        break
                    if resp.error_code:
                        raise ConnectionError(f"Heartbeat: {ErrorCode(resp.error_code).name}")
            except Exception as e:  # noqa: BLE001  (coordinator moved or broker starting: find it again)
                log.debug("Schema registry election: %s", e)
                self.elected.clear()
                if client is not None:
                    client.close()
                    client = None
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)
        if client is not None:
            try:
                client.request(
                    LEAVE_GROUP,
                    3,
                    LeaveGroupRequest(
                        group_id=GROUP_ID,
                        member_id="",
                        members=[
                            LeaveGroupRequest.MemberIdentity(
                                member_id=self.member_id, group_instance_id=None, reason="shutting down"
                            )
                        ],
                    ),
                )
            except Exception:  # noqa: BLE001  (leaving is a courtesy: the session timeout does it anyway)
                pass
            client.close()

    def _join(self, client) -> None:  # type: ignore[no-untyped-def]
        self.elected.clear()
        while True:
            resp = client.request(
                JOIN_GROUP,
                5,
                JoinGroupRequest(
                    group_id=GROUP_ID,
                    session_timeout_ms=SESSION_TIMEOUT_MS,
                    rebalance_timeout_ms=SESSION_TIMEOUT_MS,
                    member_id=self.member_id,
                    group_instance_id=None,
                    protocol_type=PROTOCOL_TYPE,
                    protocols=[
                        JoinGroupRequest.JoinGroupRequestProtocol(
                            name=PROTOCOL, metadata=json.dumps(self.identity).encode()
                        )
                    ],
                    reason=None,
                ),
            )
            if resp.error_code == ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = resp.member_id
                continue
            if resp.error_code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                continue
            if resp.error_code:
                raise ConnectionError(f"JoinGroup: {ErrorCode(resp.error_code).name}")
            break
        self.member_id, self.generation = resp.member_id, resp.generation_id
        assignments = []
        if resp.leader == self.member_id:
            members = {m.member_id: json.loads(bytes(m.metadata)) for m in resp.members}
            eligible = sorted(
                (identity_url(i), mid) for mid, i in members.items() if i.get("master_eligibility", True)
            )
            writer_id = eligible[0][1] if eligible else None
            assignment = json.dumps(
                {
                    "version": 1,
                    "error": 0 if writer_id else 1,
                    "master": writer_id,
                    "master_identity": members.get(writer_id) if writer_id else None,
                }
            ).encode()
            assignments = [
                SyncGroupRequest.SyncGroupRequestAssignment(member_id=mid, assignment=assignment)
                for mid in members
            ]
        sync = client.request(
            SYNC_GROUP,
            3,
            SyncGroupRequest(
                group_id=GROUP_ID,
                generation_id=self.generation,
                member_id=self.member_id,
                group_instance_id=None,
                protocol_type=PROTOCOL_TYPE,
                protocol_name=PROTOCOL,
                assignments=assignments,
            ),
        )
        if sync.error_code:
            raise ConnectionError(f"SyncGroup: {ErrorCode(sync.error_code).name}")
        assigned = json.loads(bytes(sync.assignment) or b"{}")
        with self._changed:
            self.writer = assigned.get("master_identity")
            self._changed.notify_all()
        self.elected.set()
        log.info(
            "Schema registry writer: %s (generation %d%s)",
            identity_url(self.writer) if self.writer else "none",
            self.generation,
            ", this broker" if self.is_writer else "",
        )
