"""What a YAML config describes, from Python: its mask, or a whole `cpsched run`."""
from __future__ import annotations

import json
from collections import namedtuple

from . import _cpsched
from ._args import _path
from ._result import Result


def _overrides(o):
    """{"key.path": value} or ["key.path=YAML", ...] -> the CLI's --set strings."""
    if o is None:
        return []
    if isinstance(o, dict):
        out = []
        for k, v in o.items():
            if isinstance(v, str):
                text = v  # YAML text, as after --set key=
            elif v is None:
                text = "null"
            else:
                try:
                    text = json.dumps(v)  # JSON is YAML: numbers, booleans, lists and maps
                except TypeError as e:
                    raise ValueError(f"overrides['{k}']: {e}") from None
            out.append(f"{k}={text}")
        return out
    if isinstance(o, (list, tuple)) and all(isinstance(s, str) for s in o):
        return list(o)
    raise ValueError("overrides: expected a dict {'key.path': value} or a list of 'key.path=YAML' strings")


def run(config, overrides=None):
    """`cpsched run CONFIG`: solve, build the plan, execute it with the config's executor. Returns
    {passed, figures (name -> value, in the executor's order), text, svg, executor, result}."""
    out = _cpsched.run(_path(config, "config"), _overrides(overrides))
    out["result"] = Result(out["result"])
    return out


Mask = namedtuple("Mask", "q_ranges k_ranges types seqlen")


def mask_from_config(config, overrides=None):
    """The mask a config describes, as arrays for Session.solve: Mask(q_ranges, k_ranges, types, seqlen)."""
    q, k, t, s = _cpsched.mask_from_config(_path(config, "config"), _overrides(overrides))
    return Mask(q, k, t, s)
