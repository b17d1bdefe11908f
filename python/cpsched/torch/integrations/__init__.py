"""cpsched.torch inside training stacks (docs/torch.md, "Using cpsched in a model").

* `ContextParallel`: one packed batch per step (`shard`), each layer's mask by kind (causal, sliding
  window, full), one plan per distinct mask per step; for any module (`cp.attention(q, k, v, window=...)`).
* `cpsched.torch.integrations.transformers`: `attn_implementation="cpsched"` for transformers models
  (pip install .[transformers]); importing it registers the attention function.
* `cpsched.torch.integrations.mesh`: a dp x cp DeviceMesh and FSDP2's fully_shard on it.
"""
from .context import ContextParallel, Step, resolve_group  # noqa: F401
from .documents import (bounds_from_cu_seqlens, bounds_from_position_ids, document_mask,  # noqa: F401
                        position_ids_of)

__all__ = ["ContextParallel", "Step", "resolve_group", "bounds_from_position_ids", "bounds_from_cu_seqlens",
           "document_mask", "position_ids_of"]
