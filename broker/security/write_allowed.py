"""A connection's cache of the Writes its principal is allowed: Produce's direct path with an authorizer.

Principal and host are fixed for a connection (until SASL re-authentication changes the principal), so the
allow decisions of handle_produce's checks (Write on the transactional id, Write on each topic) are remembered on
the connection, keyed by the authorizer's generation (bumped by every ACL change, here or from another broker)
and the principal: the next request of the connection finds them in two set lookups, without the authorizer's
memo keys. Only allowed names are remembered: a denial is left to the general path, which logs the refusal and
answers it (broker/handlers/produce.py handle_produce).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kbroker.broker.security.acls import AclOperation, ResourceType, java_host_address

if TYPE_CHECKING:
    from kbroker.broker.network import KafkaConnection
    from kbroker.broker.security.authorizer import AclAuthorizer

_WRITE, _TOPIC, _TXN = AclOperation.WRITE, ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID
# Names remembered per connection; past this the cache starts over (a producer writing to very many topics).
MAX_NAMES = 10_000


class WriteAllowed:
    """The names a connection's principal may Write, as of one authorizer generation."""

    __slots__ = ("generation", "principal", "topics", "transactional_ids")

    def __init__(self, generation: int, principal: str) -> None:
        self.generation = generation
        self.principal = principal
        self.topics: set[str] = set()
        self.transactional_ids: set[str] = set()


def write_allowed(
    authz: AclAuthorizer, conn: KafkaConnection, txn_id: str | None, topics: list[tuple[str, Any]]
) -> bool:
    """True when the principal may Write txn_id (None: no transactional batch) and every topic; False when one is
    denied (nothing logged: the general path checks again and logs it)."""
    generation = authz.generation  # read before deciding: see AclAuthorizer.generation
    principal = conn.principal
    cache: WriteAllowed | None = conn.write_allowed
    if (
        cache is None
        or cache.generation != generation
        or cache.principal != principal
        or len(cache.topics) >= MAX_NAMES
        or len(cache.transactional_ids) >= MAX_NAMES
    ):
        cache = conn.write_allowed = WriteAllowed(generation, principal)
    if txn_id is not None and txn_id not in cache.transactional_ids:
        if not authz.authorize(principal, java_host_address(conn.peer_host), _WRITE, _TXN, txn_id):
            return False
        cache.transactional_ids.add(txn_id)
    known = cache.topics
    for name, _ in topics:
        if name not in known:
            if not authz.authorize(principal, java_host_address(conn.peer_host), _WRITE, _TOPIC, name):
                return False
            known.add(name)
    return True
