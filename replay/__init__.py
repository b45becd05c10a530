"""Replay a job's dependency graph with new kernel and collective durations (what-ifs).

    import tracetool
    from tracetool.replay import Replayer, Scenario, resolve_gpu, parse_network
    r = Replayer.from_store(tracetool.connect("out/store"), "dlrm")   # build the graph once
    r.run()                                                    # identity: the measured steps
    r.run(Scenario(gpu=resolve_gpu("h100"), network=parse_network("inter_node_bw=200Gbit/s")))

See README.md (Replay: the model) for what the models assume.
"""

from .model import Scenario, resolve_gpu
from .network import parse_network
from .run import Replayer, ReplayResult, StepResult, replay

__all__ = ["Replayer", "ReplayResult", "Scenario", "StepResult", "parse_network", "replay",
           "resolve_gpu"]
