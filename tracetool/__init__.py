"""tracetool: ingest, analyse and replay PyTorch profiler (Kineto) traces."""

__version__ = "0.1.0"
