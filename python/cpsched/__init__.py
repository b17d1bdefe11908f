"""cpsched from Python: plan attention under context parallelism per layer.

    import cpsched
    s = cpsched.Session(cp_size=8, heads=(64, 8, 128, "bf16"), solver="balanced_bytes")
    r = s.solve(q_ranges, k_ranges, types)      # lists, numpy, DLPack / __array__ objects
    r.calc_meta(rank), r.comm_meta(rank, "bwd"), r.metrics, r.to_json(), r.write_svg("plan.svg")

The seed's Direct Solver API is `cpsched.magi.DynamicAttnSolver`. See docs/python.md.
Bad input raises ValueError, a plugin's own failure RuntimeError, with the CLI's messages.
"""
from __future__ import annotations

from . import _cpsched
from ._config import Mask, mask_from_config, run
from ._masks import MASK_TYPES
from ._plugins import default_plugin_dir, plugin_problems, plugins
from ._result import AttnArgs, CalcMeta, CommMeta, GroupCollectiveArg, Result, StageComm
from ._session import Session
from ._topk import TopkRowRuns, TopkSummary

__version__ = _cpsched.__version__

# The public classes name (and pickle as) their public path, cpsched.X, not the private module that holds them:
# a TopkSummary pickled on one rank unpickles on another whatever the package's inner layout.
for _cls in (Session, Result, TopkSummary, TopkRowRuns, CalcMeta, CommMeta, StageComm, GroupCollectiveArg, AttnArgs, Mask):
    _cls.__module__ = __name__
del _cls

__all__ = [
    "Session", "Result", "TopkSummary", "TopkRowRuns", "CalcMeta", "CommMeta", "StageComm", "GroupCollectiveArg", "AttnArgs",
    "plugins", "plugin_problems", "run", "mask_from_config", "MASK_TYPES", "__version__",
]
