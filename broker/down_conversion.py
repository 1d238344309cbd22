"""Fetch v0-v3: the log's record batches v2 as the message sets of magic 0 or 1 that consumers of Kafka 0.8-0.10
read (Kafka's KafkaApis.maybeConvertFetchedData with LazyDownConversionRecords).

The converted set is built in memory (a file region cannot go out with sendfile once its bytes change), so each
converted partition costs a read and a rebuild: Kafka's reason for `message.downconversion.enable`.
"""

from __future__ import annotations

from typing import Any

from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.legacy_records import MAGIC_V0, MAGIC_V1, down_convert
from kbroker.protocol.records import max_decompressed_size
from kbroker.storage.config import LogConfig

# Fetch v4 brought record batch v2 (KIP-98), v10 zstd (KIP-110).
_FIRST_V2_FETCH = 4
_FIRST_ZSTD_FETCH = 10


def legacy_fetch_magic(api_version: int) -> int | None:
    """The message format a consumer's Fetch version reads, None for record batch v2."""
    if api_version <= 1:
        return MAGIC_V0
    if api_version < _FIRST_V2_FETCH:
        return MAGIC_V1
    return None


def check_down_conversion(config: LogConfig, api_version: int) -> None:
    """Kafka's refusals before anything is converted: a zstd topic to a Fetch older than v10
    (UNSUPPORTED_COMPRESSION_TYPE), and a topic with message.downconversion.enable=false to a Fetch that needs
    conversion (UNSUPPORTED_VERSION), whether or not there is data to convert."""
    if api_version < _FIRST_ZSTD_FETCH and config.compression_type == "zstd":
        raise KafkaError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                         f"Fetch v{api_version} cannot read a zstd-compressed topic")
    if api_version < _FIRST_V2_FETCH and not config.message_downconversion_enable:
        raise KafkaError(ErrorCode.UNSUPPORTED_VERSION,
                         "down-conversion is disabled for this topic (message.downconversion.enable=false)")


def down_convert_fetched(region: Any, magic: int, fetch_offset: int, budget: int, *, whole_first: bool,
                         config: LogConfig) -> bytes:
    """The batches read from the log (a file region) converted to magic 0/1 and cut to the partition's budget.

    whole_first (Fetch v3, the first partition with data) keeps the first converted batch whole however large, as
    Kafka's min-one-message rule; before v3 Kafka sends a message cut at the limit and the client grows its
    buffer. A zstd batch cannot be converted (UnsupportedCompressionTypeError, UNSUPPORTED_COMPRESSION_TYPE)."""
    return down_convert(region.read_bytes(), magic, fetch_offset, max(budget, 0), whole_first=whole_first,
                        max_decompressed=max_decompressed_size(config.max_message_bytes))
