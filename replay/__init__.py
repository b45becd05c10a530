"""Replay a job's dependency graph with new kernel and collective durations (what-ifs).

    import tracetool
    from tracetool.replay import Replayer, Scenario, resolve_gpu, parse_network, parse_power_cap
    r = Replayer.from_store(tracetool.connect("out/store"), "dlrm")   # build the graph once
    r.run()                                                    # identity: the measured steps
    r.run(Scenario(gpu=resolve_gpu("h100"), network=parse_network("inter_node_bw=200Gbit/s")))
    r.run(Scenario(gpu_clock_mhz=1000))                        # the trace's GPU at 1000 MHz
    r.run(Scenario(power_cap=parse_power_cap("70%")))          # ... capped at 70% of its TDP

See README.md (Replay: the model) for what the models assume.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .clocks import parse_power_cap
    from .model import Scenario, resolve_gpu
    from .network import parse_network
    from .run import Replayer, ReplayResult, StepResult, replay

# resolved on first use, so that importing a submodule (the CLI does, for every command)
# does not load the simulator's compiler
_WHERE = {"Scenario": "model", "resolve_gpu": "model", "parse_network": "network",
          "parse_power_cap": "clocks",
          "Replayer": "run", "ReplayResult": "run", "StepResult": "run", "replay": "run"}
__all__ = ["ReplayResult", "Replayer", "Scenario", "StepResult", "parse_network",
           "parse_power_cap", "replay", "resolve_gpu"]


def __getattr__(name: str) -> object:
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
