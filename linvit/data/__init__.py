"""Data: find or fetch raw datasets (sources), write them as webdataset shards (shards), read batches (loader)."""

from linvit.data.loader import ShardSet
from linvit.data.shards import MANIFEST, write_shards
from linvit.data.sources import SOURCES, DataError, MissingDataError, RawData, load_raw, register_source

__all__ = ["DataError", "MANIFEST", "MissingDataError", "RawData", "SOURCES", "ShardSet", "load_raw",
           "register_source", "write_shards"]
