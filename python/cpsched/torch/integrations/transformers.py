"""transformers integration: `attn_implementation="cpsched"` runs a model's attention context-parallel.

    import cpsched.torch.integrations.transformers as cpt_hf      # registers "cpsched" with transformers
    model = AutoModelForCausalLM.from_config(config, attn_implementation="cpsched")
    cp = cpt_hf.ContextParallel(model, group=cp_group, solver="balanced_bytes")    # or mesh=..., mesh_dim="cp"
    for batch in loader:                                           # the whole packed sequence on every CP rank
        local = cp.shard(position_ids=batch["position_ids"], input_ids=batch["input_ids"],
                         labels=batch["shift_labels"])
        logits = model(input_ids=local["input_ids"], position_ids=local["position_ids"]).logits

The attention function follows transformers' contract for custom attention functions (AttentionInterface):
it is called as f(module, query, key, value, attention_mask, dropout=, scaling=, **kwargs) with query
[B, heads, L, d] and key / value [B, kv_heads, L, d] (this rank's L tokens), and returns (attn_output
[B, L, heads, d_v], None). B must be 1 (one packed sequence). The layer's mask is the step's documents
(`shard`'s position ids or cu_seqlens) with the layer's kind: a sliding window of `sliding_window` keys on the
layers the model gives one (the call's `sliding_window`, the module's, or `config.layer_types` and
`config.sliding_window`), causal otherwise, bidirectional where the module is not causal. A mask function is
registered beside it (AttentionMaskInterface) so that transformers builds no dense mask: the model's 2-D
attention_mask, if one is given, reaches the attention function, which accepts it only without padding.

Each distinct mask is solved once per step (`ContextParallel.stats`). Under torch.compile the call is a custom
operator (`torch.ops.cpsched.cp_attention`, integrations/ops.py): the compiled model has no graph break there.
"""
from __future__ import annotations

import torch

from .context import ContextParallel as _Context
from .context import resolve_group

NAME = "cpsched"
_CONTEXT_ATTR = "_cpsched_context"


def _unsupported(module, query, key, value, attention_mask, dropout, kwargs):
    """What of this call the integration cannot run (a ValueError's text), or None."""
    if not isinstance(query, torch.Tensor) or query.dim() != 4:
        return f"query: expected [batch, heads, tokens, dim], got {getattr(query, 'shape', type(query).__name__)}"
    if query.shape[0] != 1 or key.shape[0] != 1 or value.shape[0] != 1:
        return (f"query: batch size {query.shape[0]}: cpsched attention runs one packed sequence per step (batch "
                f"size 1); pack the batch's documents into one sequence with position_ids (or cu_seqlens)")
    if key.shape[2] != query.shape[2]:
        return (f"key: {key.shape[2]} keys for {query.shape[2]} queries: a cache (incremental decoding) is not "
                f"supported; call the model with use_cache=False")
    if dropout and module is not None and getattr(module, "training", False):
        return (f"dropout: attention dropout {dropout} is not supported by cpsched attention; set the config's "
                f"attention_dropout to 0")
    if kwargs.get("softcap") is not None:
        return f"softcap: attention logit soft-capping ({kwargs['softcap']}) is not supported by cpsched attention"
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        return "s_aux: attention sinks are not supported by cpsched attention"
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
            return (f"attention_mask: cpsched attention takes the documents from position_ids / cu_seqlens, not a "
                    f"prepared mask ({type(attention_mask).__name__} of shape "
                    f"{tuple(getattr(attention_mask, 'shape', ()))})")
        if not bool(attention_mask.all()):
            return ("attention_mask: the 2-D mask has padding; cpsched attention runs packed sequences: put padding "
                    "in a document of its own (positions restarting at 0) with labels -100, and pass no mask")
    return None


def _window_of(module, kwargs):
    """The layer's sliding window (keys), or None for a full-length causal layer."""
    w = kwargs.get("sliding_window")
    if w is None:
        w = getattr(module, "sliding_window", None)
    if w is None:
        cfg = getattr(module, "config", None)
        types = getattr(cfg, "layer_types", None)
        idx = getattr(module, "layer_idx", None)
        if types is not None and idx is not None and 0 <= idx < len(types) and types[idx] == "sliding_attention":
            w = getattr(cfg, "sliding_window", None)
    return None if w is None else int(w)


def cpsched_attention(module, query, key, value, attention_mask=None, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention function contract: query [1, Hq, L, D], key / value [1, Hkv, L, D] ->
    (attn_output [1, L, Hq, Dv], None). Runs cpsched.torch's distributed attention of this step's mask of the
    layer's kind (ContextParallel bound to the model)."""
    cp = getattr(module, _CONTEXT_ATTR, None)
    err = _unsupported(module, query, key, value, attention_mask, dropout, kwargs)
    if err is None and cp is None:
        err = ("model: no cpsched ContextParallel is bound to it; cpsched.torch.integrations.transformers."
               "ContextParallel(model, group=...) binds one")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = _window_of(module, kwargs) if err is None else None
    if err is None and window is not None and window < 1:
        err = f"sliding_window: a window is a number of keys >= 1, got {window}"
    # this rank's rows in cpsched's layout [tokens, heads, dim]: views of the model's tensors, no copy
    q, k, v = (x[0].transpose(0, 1) if isinstance(x, torch.Tensor) and x.dim() == 4 else x
               for x in (query, key, value))
    if cp is None:
        return _unbound(q, k, v, err)
    out = cp.attention(q, k, v, window=window, causal=bool(causal), softmax_scale=scaling,
                       position_ids=kwargs.get("position_ids"), error=err)
    return out.unsqueeze(0), None


@torch.compiler.disable
def _unbound(q, k, v, err):
    from .._api import _attention
    _attention(q, k, v, None, None, "auto", False, None, None, None, err)  # raises on every rank


def cpsched_mask(batch_size=None, q_length=None, kv_length=None, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, **kwargs):
    """transformers' mask interface for "cpsched": no dense mask; the model's 2-D attention_mask passes
    through so that the attention function can refuse padding (the masks are cpsched's ranges)."""
    return attention_mask


def register(name=NAME):
    """Registers the attention function and its mask function with transformers under `name` (done for
    "cpsched" on import). Returns the name."""
    from transformers import AttentionInterface
    AttentionInterface.register(name, cpsched_attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # pragma: no cover - transformers before the mask interface: it builds no mask for us
        return name
    AttentionMaskInterface.register(name, cpsched_mask)
    return name


class ContextParallel(_Context):
    """cpsched.torch.integrations.ContextParallel bound to a transformers model (every module of it finds it):
    the model must run attn_implementation "cpsched" (or the name given to `register`)."""

    def __init__(self, model, group=None, *, mesh=None, mesh_dim="cp", name=NAME, **options):
        super().__init__(group, mesh=mesh, mesh_dim=mesh_dim, **options)
        self.bind(model, name)

    def bind(self, model, name=NAME):
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if impl != name:
            raise ValueError(f"model: its attn_implementation is {impl!r}, not {name!r}; build it with "
                             f"attn_implementation={name!r} (or model.set_attn_implementation({name!r}))")
        for m in model.modules():
            setattr(m, _CONTEXT_ATTR, self)
        return model


register()

__all__ = ["ContextParallel", "cpsched_attention", "cpsched_mask", "register", "resolve_group", "NAME"]
