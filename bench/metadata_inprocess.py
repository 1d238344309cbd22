"""The broker's own CPU per Metadata request without sockets: what bench.authz's Metadata row costs in the interpreter.

    python -m bench.metadata_inprocess [--requests N] [--reps R] [--topics T] [--profile OUT.prof]

Starts a broker in this process with T topics of one partition each (8, as bench.authz), then feeds Metadata v12
requests for all of them (allow_auto_topic_creation false, as bench.authz sends) to a KafkaConnection whose
transport is a stub, on the connection's own network thread: framing, header decode, dispatch, the Metadata handler
and the answer's encode, without the kernel's socket work or the wake-ups. Its thread CPU time per request is
printed per repetition; the last answer is checked to name every topic, with no error.
--profile writes cProfile stats of the last repetition. Run it under `valgrind --tool=callgrind` with two request
counts for instructions per request (the difference over the difference in requests).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
from pathlib import Path

from kbroker.broker.server import KafkaServer
from kbroker.protocol import codec
from kbroker.protocol.messages import CreateTopicsRequest, MetadataRequest, RequestHeader

from bench.produce_inprocess import feed_timed, on_processor, run_beside
from bench.produce_path import connect_when_listening, recv_response

WARM = 200


def create_topics(sock: socket.socket, names: list[str]) -> None:
    req = CreateTopicsRequest(
        topics=[
            CreateTopicsRequest.CreatableTopic(name=n, num_partitions=1, replication_factor=1) for n in names
        ],
        timeout_ms=30000,
    )
    header = RequestHeader(request_api_key=19, request_api_version=7, correlation_id=1, client_id="bench")
    sock.sendall(bytes(codec.encode_request(header, req)))
    codes = [t.error_code for t in recv_response(sock, 19, 7).topics]
    if any(codes):
        raise RuntimeError(f"CreateTopics: errors {codes}")


def frames(names: list[str], count: int) -> list[bytes]:
    """Metadata v12 requests for the topics as bench.authz sends them, correlation ids 0.."""
    req = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names], allow_auto_topic_creation=False
    )
    out = []
    for cid in range(count):
        header = RequestHeader(
            request_api_key=3, request_api_version=12, correlation_id=cid, client_id="bench"
        )
        out.append(bytes(codec.encode_request(header, req)))
    return out


def measure(requests: int, reps: int, ntopics: int = 8, profile: Path | None = None) -> list[float]:
    """Thread CPU microseconds per request, one figure per repetition."""
    results: list[float] = []
    names = [f"bench-meta-{k}" for k in range(ntopics)]

    def client(server: KafkaServer, port: int) -> None:
        with connect_when_listening(port) as sock:
            create_topics(sock, names)
        reqs = frames(names, WARM + reps * requests)

        def feed_all() -> None:
            transport, timed = feed_timed(server, reqs, WARM, requests, reps, profile)
            results.extend(timed)
            if transport.answers != len(reqs):
                raise RuntimeError(f"{transport.answers} answers of {len(reqs)}")
            resp = codec.decode_response(3, 12, bytes(transport.last)[4:])[1]
            if [t.name for t in resp.topics] != names or any(t.error_code for t in resp.topics):
                raise RuntimeError(f"Metadata answered {[(t.name, t.error_code) for t in resp.topics]}")

        on_processor(server, feed_all)

    run_beside("kbroker-metadata-", client)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.metadata_inprocess", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--topics", type=int, default=8)
    ap.add_argument("--profile", type=Path, help="cProfile stats of the last repetition into this file")
    args = ap.parse_args(argv)
    results = measure(args.requests, args.reps, args.topics, args.profile)
    print(
        "in-process broker CPU per Metadata request (us): "
        + " ".join(f"{r:.1f}" for r in results)
        + f"; median {statistics.median(results):.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
