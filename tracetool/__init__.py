"""tracetool: ingest, analyse and replay PyTorch profiler (Kineto) traces."""

__version__ = "0.1.0"


def connect(store, con=None):  # noqa: ANN001, ANN201 - re-exported, typed in analysis.connect
    """A DuckDB connection over a trace store with every table and analysis view."""
    from tracetool.analysis.connect import connect as _connect

    return _connect(store, con)
