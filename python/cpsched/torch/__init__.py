"""cpsched.torch: run cpsched's plans inside PyTorch training (docs/torch.md).

    import cpsched, cpsched.torch as cpt
    s = cpsched.Session(cp_size=P, heads=(hq, hkv, d, "bf16"))
    attn = cpt.DistAttention(s, group)             # solves each call's mask (cached), then runs it
    out = attn(q, k, v, (q_ranges, k_ranges, types))
    out = cpt.attention(q, k, v, s.solve(...))     # or a plan you solved yourself
    x_local = cpt.dispatch(x, plan); y = cpt.undispatch(y_local, plan)

q, k, v are this rank's shards in the plan's layout; forward and backward run the plan's collectives
(all_to_all_single with split lists, asynchronous) and attention kernels ('torch', 'aten', 'flash', 'flex',
'triton'). `cpsched.torch.loopback.run` runs P ranks as threads of one process (one GPU).
"""
try:
    import torch as _torch  # noqa: F401
    import torch.distributed as _dist  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised by a test without torch
    raise ImportError("cpsched.torch needs PyTorch, which is not installed: pip install .[torch] "
                      "(or pip install torch)") from e

from ._api import attention, check_inputs, dispatch, layout_of, prepare, undispatch  # noqa: E402
from ._aten import AtenBackend  # noqa: E402
from ._backends import FlashBackend, FlexBackend, flash_available, flex_available  # noqa: E402
from ._exec import Comm  # noqa: E402
from ._kernels import NullBackend, TorchBackend  # noqa: E402
from ._module import DistAttention, ingest_topk, remap_topk  # noqa: E402
from ._plan import Layout, TorchPlan  # noqa: E402
from ._topk import summarize_topk, write_index_rows  # noqa: E402
from ._workspace import release_workspaces, workspace_bytes  # noqa: E402
from . import loopback  # noqa: E402

__all__ = ["attention", "DistAttention", "dispatch", "undispatch", "layout_of", "prepare", "TorchPlan", "Layout",
           "ingest_topk", "remap_topk", "summarize_topk", "write_index_rows", "TorchBackend", "FlashBackend", "FlexBackend",
           "AtenBackend", "NullBackend", "Comm", "flash_available",
           "flex_available", "check_inputs", "release_workspaces", "workspace_bytes", "loopback"]
