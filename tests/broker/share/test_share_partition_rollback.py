"""SharePartition.rollback, the in-memory half of Kafka's rollback of a failed state write, over generated
acknowledgements: taking back a batch nothing else touched since restores every offset exactly as it was (state,
member, lock, delivery count, start offset); taking it back after other acknowledgements were applied restores
only its own records and leaves the others' done. The real-socket path is test_share_state_write_failure.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kbroker.broker.share_partition import (
    ACCEPT,
    ACKNOWLEDGED,
    ACQUIRED,
    ARCHIVED,
    REJECT,
    RELEASE,
    RENEW,
    Run,
    SharePartition,
    Undo,
)

N = 40
LIMIT = 3


def held(members: list[str], counts: list[int]) -> SharePartition:
    """N records in flight from offset 0, record i acquired by members[i] with delivery count counts[i]."""
    sp = SharePartition("g", "t", 0, 0)
    sp.runs = [Run(i, i, ACQUIRED, counts[i], members[i], 100.0 + i) for i in range(N)]
    sp.end = N
    sp._advance()
    return sp


def per_offset(sp: SharePartition) -> dict[int, tuple[int, int, str | None, float]]:
    return {
        o: (r.state, r.delivery_count, r.member, r.deadline)
        for r in sp.runs
        for o in range(r.first, r.last + 1)
    }


batch = st.tuples(st.integers(0, N - 1), st.integers(0, 7)).flatmap(
    lambda fl: st.tuples(
        st.just(fl[0]),
        st.just(min(N - 1, fl[0] + fl[1])),
        st.one_of(
            st.lists(st.sampled_from([ACCEPT, RELEASE, REJECT, RENEW]), min_size=1, max_size=1),
            st.lists(st.sampled_from([ACCEPT, RELEASE, REJECT]), min_size=fl[1] + 1, max_size=fl[1] + 1),
        ),
    )
)
members = st.lists(st.sampled_from(["a", "b"]), min_size=N, max_size=N)
counts = st.lists(st.integers(1, LIMIT), min_size=N, max_size=N)


@settings(max_examples=300, deadline=None)
@given(members, counts, batch)
def test_a_batch_taken_back_alone_restores_everything(ms: list[str], cs: list[int], b: tuple) -> None:
    first, last, types = b
    sp = held(ms, cs)
    before = (sp.start, sp.end, per_offset(sp))
    undo: list[Undo] = []
    member = ms[first]
    if len(types) > 1:
        types = types[: last - first + 1]
    code = sp.acknowledge(member, first, last, types, LIMIT, 1000, undo)
    if code:  # not all held by that member: refused, nothing applied, nothing to take back
        assert undo == [] and (sp.start, sp.end, per_offset(sp)) == before
        return
    sp.rollback(undo[0])
    assert (sp.start, sp.end, per_offset(sp)) == before


@settings(max_examples=300, deadline=None)
@given(members, counts, batch, st.lists(batch, max_size=4))
def test_others_acknowledgements_stay_done(
    ms: list[str], cs: list[int], b: tuple, later: list[tuple]
) -> None:
    first, last, types = b
    sp = held(ms, cs)
    before = per_offset(sp)
    undo: list[Undo] = []
    member = ms[first]
    types = types[: last - first + 1] if len(types) > 1 else types
    if sp.acknowledge(member, first, last, types, LIMIT, 1000, undo):
        return
    mine = set(range(first, last + 1))
    for f, la, ts in later:  # other acknowledgements, written fine, of records this batch did not touch
        if mine & set(range(f, la + 1)):
            continue
        ts = ts[: la - f + 1] if len(ts) > 1 else ts
        sp.acknowledge(ms[f], f, la, ts, LIMIT, 1000)
    after_others = per_offset(sp)
    sp.rollback(undo[0])
    now = per_offset(sp)
    for o in mine:  # the batch's records are held as before it
        assert now[o] == before[o]
    for o in range(N):
        if o in mine:
            continue
        if o in after_others:
            assert now[o] == after_others[o]
        else:  # done and past the start offset: done still if it is before it now
            assert o < sp.start or now.get(o, (ACKNOWLEDGED,))[0] in (ACKNOWLEDGED, ARCHIVED)
