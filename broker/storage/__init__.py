"""Partition logs on disk: segments of wire-identical batches, sparse indexes, recovery."""

from .log import AppendInfo, Log, LogAppendError, LogConfig, ReadResult
from .segment import Segment

__all__ = ["AppendInfo", "Log", "LogAppendError", "LogConfig", "ReadResult", "Segment"]
