"""What the console shows, asked of the broker over the Kafka protocol as the signed-in user.

The console is a Kafka client of its own broker (a loopback connection per user): the broker's authorizer decides
what each user sees, exactly as for any other client, and no state owned by the broker's loops is read from the
console's threads. Every method returns plain JSON-ready dicts.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

from kbroker.console.schemas import WireFormatDecoder
from kbroker.coordinator.consumer_group_migration import decode_assignment
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    ConsumerGroupDescribeRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeLogDirsRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    FetchRequest,
    ListGroupsRequest,
    ListOffsetsRequest,
    ListTransactionsRequest,
    OffsetFetchRequest,
)
from kbroker.protocol.records import ATTR_CONTROL, CorruptRecordError, decode_records, iter_batch_headers

FETCH, LIST_OFFSETS, OFFSET_FETCH, LIST_GROUPS, DESCRIBE_GROUPS = 1, 2, 9, 16, 15
DESCRIBE_CONFIGS, DESCRIBE_LOG_DIRS, DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 32, 35, 61, 65, 66
CONSUMER_GROUP_DESCRIBE, CREATE_TOPICS, DELETE_TOPICS = 69, 19, 20
EARLIEST, LATEST = -2, -1
TOPIC_RESOURCE = 2
MAX_MESSAGES = 500


class ConsoleError(Exception):
    """A request the broker refused; `status` is the HTTP status the console answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


def raise_for(code: int, message: str | None, what: str) -> None:
    """ConsoleError with the HTTP status a browser should see for a Kafka error code."""
    if code == 0:
        return
    name = _error_name(code)
    status = 403 if "AUTHORIZATION" in name else 404 if name == "UNKNOWN_TOPIC_OR_PARTITION" else \
        409 if name == "TOPIC_ALREADY_EXISTS" else 400
    raise ConsoleError(status, f"{what}: {name}{': ' + message if message else ''}")


def _text(data: bytes | None) -> dict[str, Any] | None:
    """A key, value or header as the browser shows it: UTF-8 text (JSON when it parses), else base64."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"encoding": "base64", "data": base64.b64encode(data).decode()}
    try:
        json.loads(text)
        return {"encoding": "json", "data": text}
    except ValueError:
        return {"encoding": "text", "data": text}


class ClusterView:
    """One user's view: a WireClient to the broker, serialised (a connection answers one request at a time)."""

    def __init__(self, client: Any, decoder: WireFormatDecoder | None = None) -> None:
        self.client = client
        self.decoder = decoder or WireFormatDecoder(None)
        self.broken = False  # a request failed midway: the connection may hold a late answer, so it is replaced
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self.client.close()

    def _call(self, api_key: int, version: int, body: Any) -> Any:
        with self._lock:
            try:
                return self.client.request(api_key, version, body)
            except BaseException:
                self.broken = True
                raise

    # ------------------------------------------------------------ cluster and topics

    def _metadata(self, topics: list[str] | None = None) -> Any:
        with self._lock:
            try:
                return self.client.metadata(topics)
            except BaseException:
                self.broken = True
                raise

    def brokers(self) -> dict[str, Any]:
        md = self._metadata([])
        return {
            "cluster_id": md.cluster_id,
            "controller_id": md.controller_id,
            "brokers": [{"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
                         "controller": b.node_id == md.controller_id} for b in sorted(md.brokers, key=lambda b: b.node_id)],
        }

    def _offsets(self, partitions: dict[str, list[int]], timestamp: int) -> dict[tuple[str, int], int]:
        if not partitions:
            return {}
        Topic, Partition = ListOffsetsRequest.ListOffsetsTopic, ListOffsetsRequest.ListOffsetsPartition
        req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
            Topic(name=t, partitions=[Partition(partition_index=p, current_leader_epoch=-1, timestamp=timestamp)
                                      for p in ps]) for t, ps in partitions.items()])
        resp = self._call(LIST_OFFSETS, 7, req)
        return {(t.name, p.partition_index): p.offset for t in resp.topics for p in t.partitions
                if p.error_code == 0}

    def _sizes(self, topics: list[str] | None) -> dict[tuple[str, int], int]:
        Topic = DescribeLogDirsRequest.DescribableLogDirTopic
        req = DescribeLogDirsRequest(topics=None if topics is None else [Topic(topic=t, partitions=[])
                                                                         for t in topics])
        if topics is not None:
            md = self._metadata(topics)
            req.topics = [Topic(topic=t.name, partitions=[p.partition_index for p in t.partitions])
                          for t in md.topics if t.error_code == 0]
        resp = self._call(DESCRIBE_LOG_DIRS, 4, req)
        sizes: dict[tuple[str, int], int] = {}
        for result in resp.results:
            for t in result.topics:
                for p in t.partitions:
                    if not p.is_future_key:
                        sizes[(t.name, p.partition_index)] = sizes.get((t.name, p.partition_index), 0) + p.partition_size
        return sizes

    def topics(self) -> dict[str, Any]:
        md = self._metadata(None)
        parts = {t.name: [p.partition_index for p in t.partitions] for t in md.topics if t.error_code == 0}
        start, end = self._offsets(parts, EARLIEST), self._offsets(parts, LATEST)
        sizes = self._sizes(None)
        out = []
        for t in sorted(md.topics, key=lambda t: t.name):
            if t.error_code:
                continue
            ps = parts[t.name]
            out.append({
                "name": t.name, "internal": t.is_internal, "partitions": len(ps),
                "replication_factor": max((len(p.replica_nodes) for p in t.partitions), default=0),
                "under_replicated": sum(1 for p in t.partitions if len(p.isr_nodes) < len(p.replica_nodes)),
                "messages": sum(end.get((t.name, p), 0) - start.get((t.name, p), 0) for p in ps),
                "size_bytes": sum(sizes.get((t.name, p), 0) for p in ps),
            })
        return {"topics": out}

    def topic(self, name: str) -> dict[str, Any]:
        md = self._metadata([name])
        (t,) = md.topics
        if t.error_code:
            raise ConsoleError(404 if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION else 403,
                               f"topic {name}: {_error_name(t.error_code)}")
        ps = [p.partition_index for p in t.partitions]
        start, end = self._offsets({name: ps}, EARLIEST), self._offsets({name: ps}, LATEST)
        sizes = self._sizes([name])
        partitions = [{
            "partition": p.partition_index, "leader": p.leader_id, "leader_epoch": p.leader_epoch,
            "replicas": list(p.replica_nodes), "isr": list(p.isr_nodes), "offline": list(p.offline_replicas),
            "start_offset": start.get((name, p.partition_index)), "end_offset": end.get((name, p.partition_index)),
            "size_bytes": sizes.get((name, p.partition_index), 0),
        } for p in sorted(t.partitions, key=lambda p: p.partition_index)]
        return {"name": name, "internal": t.is_internal, "partitions": partitions, "configs": self._configs(name)}

    def _configs(self, topic: str) -> list[dict[str, Any]]:
        Resource = DescribeConfigsRequest.DescribeConfigsResource
        resp = self._call(DESCRIBE_CONFIGS, 4, DescribeConfigsRequest(
            resources=[Resource(resource_type=TOPIC_RESOURCE, resource_name=topic, configuration_keys=None)],
            include_synonyms=False, include_documentation=False))
        (result,) = resp.results
        if result.error_code:
            return []
        return [{"name": c.name, "value": None if c.is_sensitive else c.value, "default": c.is_default,
                 "source": c.config_source, "read_only": c.read_only} for c in sorted(result.configs,
                                                                                   key=lambda c: c.name)]

    # ------------------------------------------------------------ messages

    def messages(self, topic: str, partition: int, offset: int | None = None, timestamp: int | None = None,
                 limit: int = 50) -> dict[str, Any]:
        """Up to `limit` records of one partition from an offset, or from the first at or after a timestamp
        (ms); without either, the last `limit` records."""
        limit = max(1, min(limit, MAX_MESSAGES))
        bounds = {(topic, partition): (self._offsets({topic: [partition]}, EARLIEST),
                                       self._offsets({topic: [partition]}, LATEST))}
        start_map, end_map = bounds[(topic, partition)]
        if (topic, partition) not in end_map:
            raise ConsoleError(404, f"{topic}-{partition}: no such partition, or not readable as this user")
        start, end = start_map[(topic, partition)], end_map[(topic, partition)]
        if timestamp is not None:
            found = self._offsets({topic: [partition]}, timestamp)
            offset = found.get((topic, partition), end)
            if offset < 0:  # no record at or after that time
                offset = end
        elif offset is None:
            offset = max(start, end - limit)
        offset = max(offset, start)
        records: list[dict[str, Any]] = []
        position = offset
        while len(records) < limit and position < end:
            batch = self._fetch(topic, partition, position)
            if batch is None:
                break
            progressed = False
            for pos, header in iter_batch_headers(batch):
                if pos + header.size_in_bytes > len(batch):
                    break
                next_offset = header.base_offset + header.last_offset_delta + 1
                if next_offset <= position:
                    continue
                progressed = True
                if not header.attributes & ATTR_CONTROL:
                    try:
                        decoded = decode_records(batch, pos)
                    except CorruptRecordError:
                        decoded = []
                    for r in decoded:
                        if r.offset >= position and len(records) < limit:
                            records.append({
                                "offset": r.offset, "timestamp": r.timestamp,
                                "key": self.decoder.decode(r.key) or _text(r.key),
                                "value": self.decoder.decode(r.value) or _text(r.value),
                                "headers": [{"key": k, "value": _text(v)} for k, v in r.headers],
                            })
                position = next_offset
            if not progressed:
                break
        return {"topic": topic, "partition": partition, "start_offset": start, "end_offset": end,
                "from_offset": offset, "records": records}

    def _fetch(self, topic: str, partition: int, offset: int) -> bytes | None:
        req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=4 << 20, isolation_level=0,
                           session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                               FetchRequest.FetchPartition(partition=partition, current_leader_epoch=-1,
                                                           fetch_offset=offset, log_start_offset=-1,
                                                           partition_max_bytes=1 << 20)])],
                           forgotten_topics_data=[], rack_id="")
        resp = self._call(FETCH, 11, req)
        if resp.error_code:
            raise ConsoleError(403, f"Fetch: {_error_name(resp.error_code)}")
        for t in resp.responses:
            for p in t.partitions:
                if p.error_code:
                    raise ConsoleError(403 if p.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED else 409,
                                       f"{topic}-{partition}: {_error_name(p.error_code)}")
                data = p.records
                if data is None:
                    return None
                return bytes(data) if not isinstance(data, bytes) else data
        return None

    # ------------------------------------------------------------ groups

    def groups(self) -> dict[str, Any]:
        resp = self._call(LIST_GROUPS, 5, ListGroupsRequest(states_filter=[], types_filter=[]))
        if resp.error_code:
            raise ConsoleError(403, f"ListGroups: {_error_name(resp.error_code)}")
        out = []
        for g in sorted(resp.groups, key=lambda g: g.group_id):
            lag = self._lag(g.group_id)
            out.append({"group_id": g.group_id, "state": g.group_state, "type": g.group_type,
                        "protocol_type": g.protocol_type, "lag": sum(p["lag"] for p in lag if p["lag"] is not None)})
        return {"groups": out}

    def _lag(self, group_id: str) -> list[dict[str, Any]]:
        Group = OffsetFetchRequest.OffsetFetchRequestGroup
        resp = self._call(OFFSET_FETCH, 8, OffsetFetchRequest(
            groups=[Group(group_id=group_id, topics=None)], require_stable=False))
        (g,) = resp.groups
        if g.error_code:
            return []
        committed = {(t.name, p.partition_index): p.committed_offset for t in g.topics for p in t.partitions
                     if p.error_code == 0 and p.committed_offset >= 0}
        by_topic: dict[str, list[int]] = {}
        for t, p in committed:
            by_topic.setdefault(t, []).append(p)
        end = self._offsets(by_topic, LATEST)
        return [{"topic": t, "partition": p, "committed_offset": off, "end_offset": end.get((t, p)),
                 "lag": None if (t, p) not in end else max(0, end[(t, p)] - off)}
                for (t, p), off in sorted(committed.items())]

    def group(self, group_id: str) -> dict[str, Any]:
        listed = self._call(LIST_GROUPS, 5, ListGroupsRequest(states_filter=[], types_filter=[]))
        kinds = {g.group_id: g.group_type for g in listed.groups}
        if group_id not in kinds:
            raise ConsoleError(404, f"group {group_id}: no such group, or not visible to this user")
        members: list[dict[str, Any]] = []
        state = ""
        # KIP-848 groups (type "consumer") are described by ConsumerGroupDescribe, classic ones by DescribeGroups;
        # both speak the "consumer" protocol type when their members are Kafka consumers.
        protocol_type, assignor, epoch = "", "", None
        if kinds[group_id] == "consumer":
            resp = self._call(CONSUMER_GROUP_DESCRIBE, 0, ConsumerGroupDescribeRequest(
                group_ids=[group_id], include_authorized_operations=False))
            (d,) = resp.groups
            raise_for(d.error_code, d.error_message, f"group {group_id}")
            state, protocol_type, assignor, epoch = d.group_state, "consumer", d.assignor_name, d.group_epoch
            for m in d.members:
                members.append({"member_id": m.member_id, "client_id": m.client_id, "host": m.client_host,
                                "instance_id": m.instance_id, "epoch": m.member_epoch,
                                "subscribed_topics": sorted(m.subscribed_topic_names),
                                "assignment": {tp.topic_name: sorted(tp.partitions)
                                               for tp in m.assignment.topic_partitions}})
        else:
            resp = self._call(DESCRIBE_GROUPS, 5, DescribeGroupsRequest(
                groups=[group_id], include_authorized_operations=False))
            (d,) = resp.groups
            raise_for(d.error_code, None, f"group {group_id}")
            state, protocol_type, assignor = d.group_state, d.protocol_type, d.protocol_data
            for m in d.members:
                try:
                    assignment = decode_assignment(bytes(m.member_assignment)) if d.protocol_type == "consumer" \
                        else {}
                except ValueError:
                    assignment = {}
                members.append({"member_id": m.member_id, "client_id": m.client_id, "host": m.client_host,
                                "instance_id": m.group_instance_id, "epoch": None,
                                "assignment": {t: sorted(ps) for t, ps in assignment.items()}})
        return {"group_id": group_id, "type": kinds[group_id], "protocol_type": protocol_type, "assignor": assignor,
                "group_epoch": epoch, "state": state, "members": members, "offsets": self._lag(group_id),
                "at": int(time.time() * 1000)}

    # ------------------------------------------------------------ transactions and producers

    def transactions(self) -> dict[str, Any]:
        resp = self._call(LIST_TRANSACTIONS, 0, ListTransactionsRequest(state_filters=[], producer_id_filters=[]))
        ids = [t.transactional_id for t in resp.transaction_states]
        described = {}
        if ids:
            d = self._call(DESCRIBE_TRANSACTIONS, 0, DescribeTransactionsRequest(transactional_ids=ids))
            described = {t.transactional_id: t for t in d.transaction_states if t.error_code == 0}
        out = []
        for t in sorted(resp.transaction_states, key=lambda t: t.transactional_id):
            d = described.get(t.transactional_id)
            out.append({
                "transactional_id": t.transactional_id, "producer_id": t.producer_id, "state": t.transaction_state,
                "producer_epoch": d.producer_epoch if d else None,
                "timeout_ms": d.transaction_timeout_ms if d else None,
                "start_time_ms": d.transaction_start_time_ms if d else None,
                "partitions": sorted(f"{tp.topic}-{p}" for tp in d.topics for p in tp.partitions) if d else [],
            })
        return {"transactions": out}

    def producers(self, topic: str) -> dict[str, Any]:
        md = self._metadata([topic])
        (t,) = md.topics
        if t.error_code:
            raise ConsoleError(404, f"topic {topic}: {_error_name(t.error_code)}")
        req = DescribeProducersRequest(topics=[DescribeProducersRequest.TopicRequest(
            name=topic, partition_indexes=sorted(p.partition_index for p in t.partitions))])
        resp = self._call(DESCRIBE_PRODUCERS, 0, req)
        out = []
        for tr in resp.topics:
            for p in tr.partitions:
                for s in p.active_producers if p.error_code == 0 else []:
                    out.append({"partition": p.partition_index, "producer_id": s.producer_id,
                                "producer_epoch": s.producer_epoch, "last_sequence": s.last_sequence,
                                "last_timestamp": s.last_timestamp,
                                "current_txn_start_offset": s.current_txn_start_offset})
        return {"topic": topic, "producers": out}

    # ------------------------------------------------------------ changes (the authorizer decides who may)

    def create_topic(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise ConsoleError(400, 'expected {"name": ..., "partitions": N, "replication_factor": N}')
        try:
            partitions = int(body.get("partitions", -1))
            replication = int(body.get("replication_factor", -1))
        except (TypeError, ValueError):
            raise ConsoleError(400, "partitions and replication_factor must be whole numbers") from None
        configs = body.get("configs") or {}
        if not isinstance(configs, dict):
            raise ConsoleError(400, "configs must be an object of strings")
        Topic, Config = CreateTopicsRequest.CreatableTopic, CreateTopicsRequest.CreatableTopicConfig
        resp = self._call(CREATE_TOPICS, 5, CreateTopicsRequest(topics=[Topic(
            name=body["name"], num_partitions=partitions, replication_factor=replication, assignments=[],
            configs=[Config(name=str(k), value=str(v)) for k, v in configs.items()])], timeout_ms=30000,
            validate_only=False))
        (t,) = resp.topics
        raise_for(t.error_code, t.error_message, f"create topic {body['name']}")
        return {"created": t.name, "partitions": t.num_partitions, "replication_factor": t.replication_factor}

    def delete_topic(self, name: str) -> dict[str, Any]:
        resp = self._call(DELETE_TOPICS, 5, DeleteTopicsRequest(topic_names=[name], timeout_ms=30000))
        (r,) = resp.responses
        raise_for(r.error_code, r.error_message, f"delete topic {name}")
        return {"deleted": name}
