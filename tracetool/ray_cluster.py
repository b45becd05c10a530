"""The Ray cluster tracetool's ``--executor ray`` runs on (ingest's per-file tasks, the
report's per-rank analyses): the one ``RAY_ADDRESS`` names, else a local one started for
the command and stopped after it. Ray is an optional extra (``pip install 'tracetool[ray]'``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from tracetool.errors import InputError


@contextmanager
def ray_cluster() -> Iterator[ModuleType]:
    """``ray``, initialised on the cluster (shut down at the end when this started it);
    InputError when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray: pip install 'tracetool[ray]'") from None
    started = not ray.is_initialized()
    if started:
        address = os.environ.get("RAY_ADDRESS") or None
        # a cluster of its own serves this machine only: it listens on 127.0.0.1
        local = {} if address else {"_node_ip_address": "127.0.0.1"}
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level="warning", **local)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()
