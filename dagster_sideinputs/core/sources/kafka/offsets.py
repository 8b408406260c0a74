"""A Kafka main input's offset ranges: planning the next batch's, and checking pinned ones.

Planning (:func:`plan_ranges`) asks the brokers (no Spark) for every partition's earliest
and end offsets and every topic's id, and pins, per partition, ``[start, end)``: ``start``
is where the previous batch ended, ``end`` the log end (capped by
``max_records_per_batch``, :func:`share_out`). What the plan pins is checked against the
brokers first, so nothing is ever skipped silently:

- offsets removed by retention before they were read (``start`` below the earliest
  offset) are an error naming the topic, partition and offsets, or, with
  ``on_data_loss="skip"``, skipped and recorded in the plan (counted in the metrics);
- a topic deleted and created again (another topic id), a partition that disappeared,
  a log end that moved back: errors naming the topic, the partition and the position;
- partitions and topics that appear are read from their earliest offset.

Each of these errors offers a reset that keeps exactly once what the brokers still
hold: ``operator.reset(main_from='keep')`` (:func:`keep_position`) drops only the
position of a vanished topic or partition, reads a recreated topic from its beginning,
starts a partition whose unread offsets retention deleted at its log start, and moves
a truncated partition back to its log end; every other partition keeps its position.

A replay checks its pinned ranges against the brokers first (:func:`check_pinned`):
Spark's connector would not notice a recreated topic (it ignores topic ids), and would
wait ``pollTimeoutMs`` for offsets past the log end.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from dagster_sideinputs.core.declarations import KeyGroups
from dagster_sideinputs.core.sources.kafka.admin import KafkaMetadata
from dagster_sideinputs.core.sources.kafka.declaration import KafkaInput
from dagster_sideinputs.core.sources.kafka.keyed import check_partition_count
from dagster_sideinputs.core.state.plan import MainRange, OffsetRange
from dagster_sideinputs.errors import KafkaOffsetsLostError, OperatorStateError, preview

_KEEP = "`operator.reset(main_from='keep')`"
_OTHERS = "every other partition keeps its position: nothing is read twice or skipped"


def _position(ranges: Sequence[OffsetRange], topic: str) -> str:
    shown = [f"[{r.partition}] at {r.end}" for r in ranges if r.topic == topic]
    return f"{topic} " + ", ".join(shown[:6]) + (" ..." if len(shown) > 6 else "")


def share_out(ranges: list[OffsetRange], limit: int) -> list[OffsetRange]:
    """Cap the ranges at ``limit`` offsets in all, shared by backlog.

    Every partition gets ``floor(limit * backlog / total)``, and what rounding leaves goes
    to the largest remainders (ties: topic, partition), so a backlog is drained evenly
    and the split is a pure function of the offsets.
    """
    total = sum(r.size for r in ranges)
    if total <= limit:
        return ranges
    shares = {i: limit * r.size // total for i, r in enumerate(ranges)}
    left = limit - sum(shares.values())
    order = sorted(
        (i for i, r in enumerate(ranges) if r.size > shares[i]),
        key=lambda i: (-((limit * ranges[i].size) % total), ranges[i].topic, ranges[i].partition),
    )
    for i in order[:left]:
        shares[i] += 1
    return [
        OffsetRange(r.topic, r.partition, r.start, r.start + shares[i], r.log_end)
        for i, r in enumerate(ranges)
    ]


def plan_ranges(
    kafka: KafkaInput,
    meta: KafkaMetadata,
    label: str,
    previous: MainRange | None,
    pre_keyed: KeyGroups | None,
) -> MainRange:
    """The next batch's offset ranges: from where ``previous`` ended to each log end.

    Raises:
        KafkaOffsetsLostError: retention removed offsets not read yet (``on_data_loss="fail"``).
        OperatorStateError: a topic or partition read so far is gone or was recreated, or a
            log ends before the operator's position.
    """
    last = previous if previous is not None and previous.kind == "kafka" else None
    known = {(r.topic, r.partition): r.end for r in last.offsets} if last else {}
    known_ids = dict(last.topic_ids) if last else {}
    read_topics = sorted({topic for topic, _ in known})
    topics = meta.topics()
    described = meta.describe([*topics, *read_topics])
    check_topics(label, last, described, read_topics, known_ids, pending=False)
    partitions = [
        (topic, p)
        for topic in sorted(set(topics) | set(read_topics))
        if topic in described
        for p in described[topic].partitions
    ]
    earliest = meta.offsets(partitions, "earliest")
    latest = meta.offsets(partitions, "latest")
    ranges: list[OffsetRange] = []
    lost: list[OffsetRange] = []
    gone: list[str] = []
    behind: list[str] = []
    for tp in partitions:
        low, high = earliest[tp], latest[tp]
        if tp in known:
            start = known[tp]
        elif previous is None:  # the operator's first batch
            start = low if kafka.starting_offsets == "earliest" else high
        else:  # a partition or topic that appeared: everything it holds is new
            start = low
        if start < low:
            if kafka.on_data_loss == "fail":
                gone.append(
                    f"{tp[0]}[{tp[1]}] offsets {start}..{low} (the log now starts at {low})"
                )
                continue
            lost.append(OffsetRange(tp[0], tp[1], start, low))
            start = low
        if start > high:
            behind.append(f"{tp[0]}[{tp[1]}] read up to {start}, log ends at {high}")
            continue
        ranges.append(OffsetRange(tp[0], tp[1], start, high, high))
    if gone:
        raise KafkaOffsetsLostError(
            f"{label}: {len(gone)} partition(s) lost records the operator had not "
            f"read yet (deleted by retention or by hand): {preview(gone, 5)}. Nothing was "
            "written.",
            fix="keep records longer than the operator can fall behind (retention.ms); to "
            f"go on without them once, {_KEEP} starts those partitions at their log start "
            f"({_OTHERS} of what the brokers hold); for good, declare "
            'MainInput.kafka(..., on_data_loss="skip") (the skipped offsets are counted in '
            "the metrics)",
        )
    if behind:
        raise OperatorStateError(
            f"{label}: partition log(s) end before the operator's position: "
            f"{preview(behind, 5)}. The log was truncated (an unclean leader election) "
            "or replaced; reading on would skip or repeat records. Nothing was written.",
            fix=f"check the topic; to go on from what the log holds now, {_KEEP} moves "
            f"those partitions back to their log end ({_OTHERS})",
        )
    if kafka.max_records_per_batch is not None:
        ranges = share_out(ranges, kafka.max_records_per_batch)
    ids = {t: described[t].topic_id for t in {t for t, _ in partitions}}
    if pre_keyed is not None:
        check_partition_count(ranges, pre_keyed, label)
    anchor = previous is None and kafka.starting_offsets == "latest" and bool(ranges)
    return MainRange("kafka", offsets=tuple(ranges), topic_ids=ids, lost=tuple(lost), anchor=anchor)


def check_topics(
    label: str,
    last: MainRange | None,
    described: Mapping[str, Any],
    topics: Sequence[str],
    known_ids: Mapping[str, str],
    *,
    pending: bool,
) -> None:
    """The topics read so far still exist, with the same ids and partitions."""
    if last is None:
        return
    when = "while a batch of it was pending" if pending else "after the operator read it"
    for topic in topics:
        info = described.get(topic)
        if info is None:
            raise OperatorStateError(
                f"{label}: topic {topic!r} is gone {when} (position "
                f"{_position(last.offsets, topic)}). Records would be waited for forever "
                "or skipped. Nothing was written.",
                fix=f"restore the topic; if it was removed on purpose, {_KEEP} drops only "
                f"its position ({_OTHERS})",
            )
        known = known_ids.get(topic)
        if known and info.topic_id != known:
            raise OperatorStateError(
                f"{label}: topic {topic!r} was deleted and created again {when} "
                f"(topic id {known} -> {info.topic_id}). The operator's position "
                f"({_position(last.offsets, topic)}) refers to the old topic: reading on "
                "would skip the new topic's first records. Nothing was written.",
                fix=f"read the new topic from its beginning with {_KEEP} (outputs keep the "
                f"old topic's records; {_OTHERS}), or restore the old topic",
            )
        missing = sorted(
            r.partition
            for r in last.offsets
            if r.topic == topic and r.partition not in info.partitions
        )
        if missing:
            raise OperatorStateError(
                f"{label}: topic {topic!r} has partitions {list(info.partitions)} "
                f"now, but the operator read partition(s) {missing} (position "
                f"{_position([r for r in last.offsets if r.partition in missing], topic)}): "
                f"the partition count shrank {when}. Nothing was written.",
                fix="restore the partitions; if the topic was rebuilt on purpose, "
                f"{_KEEP} drops only those partitions' positions ({_OTHERS})",
            )


def check_pinned(meta: KafkaMetadata, label: str, main: MainRange) -> None:
    """The brokers still hold every offset a replayed batch pinned, in the same topics.

    Raises:
        KafkaOffsetsLostError: some pinned offsets are no longer in the log.
        OperatorStateError: a pinned topic or partition is gone or was recreated.
    """
    wanted = [r for r in main.offsets if r.size]
    topics = sorted({r.topic for r in wanted})
    described = meta.describe(topics)
    check_topics(label, main, described, topics, main.topic_ids, pending=True)
    earliest = meta.offsets([(r.topic, r.partition) for r in wanted], "earliest")
    latest = meta.offsets([(r.topic, r.partition) for r in wanted], "latest")
    gone = [
        f"{r} (the log now holds {earliest[(r.topic, r.partition)]}.."
        f"{latest[(r.topic, r.partition)]})"
        for r in wanted
        if r.start < earliest[(r.topic, r.partition)] or r.end > latest[(r.topic, r.partition)]
    ]
    if gone:
        raise KafkaOffsetsLostError(
            f"{label}: an interrupted batch pinned offsets that the brokers no longer "
            f"hold: {preview(gone, 5)}. Some of its outputs are committed, so it can only be "
            "finished by reading exactly those records. Nothing more was written.",
            fix="restore the records if you can (no reset can finish that batch exactly); "
            f"otherwise {_KEEP} goes on from the last committed position with what the "
            "brokers hold (the committed outputs keep what they have of the batch, and get "
            "its records still in the log again)",
        )


def keep_position(meta: KafkaMetadata, label: str, last: MainRange) -> tuple[MainRange, list[str]]:
    """The recorded position ``last``, for what the brokers hold now (the exact reset).

    A topic that is gone, or partitions of it that are gone, lose their position (the
    records they held cannot be read by anyone); a recreated topic loses its position
    and id, so the next batch reads the new topic from its earliest offset, as a topic
    that appeared; a partition whose unread offsets retention deleted starts at its log
    start, one whose log ends before the position at its log end. Every other partition
    keeps its position. Returns the position and a note per change.
    """
    topics = sorted({r.topic for r in last.offsets})
    described = meta.describe(topics)
    ids = dict(last.topic_ids)
    notes: list[str] = []
    kept: list[OffsetRange] = []
    for topic in topics:
        info = described.get(topic)
        mine = [r for r in last.offsets if r.topic == topic]
        if info is None:
            notes.append(f"topic {topic!r} is gone: position {_position(mine, topic)} dropped")
            ids.pop(topic, None)
            continue
        if ids.get(topic) and info.topic_id != ids[topic]:
            notes.append(
                f"topic {topic!r} was created again: position {_position(mine, topic)} "
                "dropped, the new topic is read from its earliest offset"
            )
            ids.pop(topic)
            continue
        for r in mine:
            if r.partition in info.partitions:
                kept.append(r)
            else:
                notes.append(f"partition {topic}[{r.partition}] is gone: position {r.end} dropped")
    partitions = [(r.topic, r.partition) for r in kept]
    earliest = meta.offsets(partitions, "earliest")
    latest = meta.offsets(partitions, "latest")
    offsets = []
    for r in kept:
        low, high = earliest[(r.topic, r.partition)], latest[(r.topic, r.partition)]
        at = r.end
        if at < low:
            notes.append(f"{r.topic}[{r.partition}] offsets {at}..{low} were deleted unread")
            at = low
        elif at > high:
            notes.append(f"{r.topic}[{r.partition}] log ends at {high}, before the position {at}")
            at = high
        offsets.append(OffsetRange(r.topic, r.partition, at, at, high))
    return replace(last, offsets=tuple(offsets), topic_ids=ids, lost=(), anchor=False), notes
