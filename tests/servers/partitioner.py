"""Kafka's default partitioner for keyed records, in plain Python.

The Java client (``BuiltInPartitioner.partitionForKey``) places a record with a key on
partition ``toPositive(murmur2(key)) % num_partitions``; librdkafka does the same with
``partitioner=murmur2_random`` (its own default, ``consistent_random``, hashes with
CRC32 and places keys elsewhere). A topic is "pre-keyed" when every record sits on the
partition this function names for its key bytes.

The module has no dependencies, so it can move into the package unchanged.
"""

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 hash of ``data``, as Java's signed ``int``.

    Same result as ``org.apache.kafka.common.utils.Utils.murmur2``.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    body = length & ~3
    for i in range(0, body, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[body + 2] << 16
    if rest >= 2:
        h ^= data[body + 1] << 8
    if rest >= 1:
        h ^= data[body]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def default_partition(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record with this key.

    Args:
        key: The record key as serialized bytes (for a string key, its UTF-8 bytes).
        num_partitions: The topic's partition count when the record was produced.

    Returns:
        ``(murmur2(key) & 0x7fffffff) % num_partitions``, as Java's ``Utils.toPositive``.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
