"""Kineto trace files -> the Parquet trace store (see tracetool.schema)."""

from .pipeline import FileResult, Options, ingest

__all__ = ["FileResult", "Options", "ingest"]
