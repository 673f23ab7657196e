"""Data: find or fetch raw datasets (sources), write them as webdataset shards (shards), read batches
(loader), with timm's transforms described by a `Pipeline` (transforms)."""

from linvit.data.loader import ShardSet
from linvit.data.shards import MANIFEST, write_shards
from linvit.data.sources import SOURCES, DataError, EncodedData, MissingDataError, RawData, load_raw, register_source
from linvit.data.transforms import Pipeline

__all__ = ["DataError", "EncodedData", "MANIFEST", "MissingDataError", "Pipeline", "RawData", "SOURCES", "ShardSet",
           "load_raw", "register_source", "write_shards"]
