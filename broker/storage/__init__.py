"""Partition logs on disk: segments of wire-identical batches, sparse indexes, recovery;
and the lock that keeps one broker process per data directory."""

from minibroker.broker.storage.log import AppendInfo, Log, LogAppendError, LogConfig, ReadResult
from minibroker.broker.storage.segment import Segment

__all__ = ["AppendInfo", "Log", "LogAppendError", "LogConfig", "ReadResult", "Segment"]
