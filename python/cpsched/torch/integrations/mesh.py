"""Device meshes for context parallelism beside data parallelism, and FSDP2 on them.

A 2-D mesh (dp x cp): the ranks of one "cp" row share a packed sequence (cpsched's group), the "dp" rows
train on different batches. FSDP2's `fully_shard` goes on the other dimension (parameters sharded over dp;
the CP ranks of a row hold the same shards, and an all-reduce hook after each reduce-scatter adds their
partial gradients over cp) or on the same ranks (sharded over the flattened dp x cp). Either way every
rank's gradient is the sum over the ranks (divide factor 1): each rank's loss is its tokens' share of the
global loss (the sum over its tokens divided by the global number of tokens), so the sum is the global
gradient.
"""
from __future__ import annotations


def make_mesh(dp, cp, device_type="cpu", names=("dp", "cp")):
    """init_device_mesh(device_type, (dp, cp)) with named dimensions: CP groups are runs of cp consecutive
    ranks (keep them inside a node)."""
    from torch.distributed.device_mesh import init_device_mesh
    for name, v in (("dp", dp), ("cp", cp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a positive integer, got {v!r}")
    return init_device_mesh(device_type, (dp, cp), mesh_dim_names=tuple(names))


def _fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def fsdp_mesh(mesh, *, shard="dp", cp="cp", same_ranks=False):
    """The 1-D mesh FSDP2 shards over: dimension `shard` of `mesh`, or (same_ranks) the flattened
    (shard, cp) dimensions."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    for n in (shard, cp):
        if n not in names:
            raise ValueError(f"mesh: it has no dimension {n!r} (its dimensions: {list(names)})")
    if same_ranks:
        dims = (shard, cp) if names.index(shard) < names.index(cp) else (cp, shard)
        return mesh[dims]._flatten("_".join(dims))
    return mesh[shard]


def fully_shard_model(model, mesh, layers, *, shard="dp", cp="cp", same_ranks=False, divide_factor=1.0,
                      **fsdp_kwargs):
    """FSDP2 on a dp x cp mesh: `fully_shard` on each module of `layers` (e.g. a transformers model's
    decoder layers) and on `model`, sharded over dimension `shard` (the CP ranks' partial gradients added by
    an all-reduce over `cp` after each reduce-scatter: FSDP2's all-reduce hook) or, same_ranks, over the
    flattened dp x cp ranks. Gradients are reduced as sums (`divide_factor`, default 1: each rank's loss is
    its share of the global loss). Returns the model."""
    import torch.distributed as dist
    fully_shard = _fully_shard()
    m = fsdp_mesh(mesh, shard=shard, cp=cp, same_ranks=same_ranks)
    mods = list(layers) + [model]
    for mod in mods:
        fully_shard(mod, mesh=m, **fsdp_kwargs)
    cp_group = None if same_ranks else mesh.get_group(cp)
    for mod in mods:
        if divide_factor is not None:
            if hasattr(mod, "set_gradient_divide_factor"):
                mod.set_gradient_divide_factor(float(divide_factor))
            else:  # torch < 2.7
                mod.set_reduce_scatter_divide_factor(float(divide_factor))
            if float(divide_factor) == 1.0 and hasattr(mod, "set_force_sum_reduction_for_comms"):
                mod.set_force_sum_reduction_for_comms(True)  # plain sums (gloo has no PREMUL_SUM)
        if cp_group is not None and dist.get_world_size(cp_group) > 1:
            if not hasattr(mod, "set_all_reduce_hook"):
                raise ValueError("same_ranks: this torch's FSDP2 has no all-reduce hook (torch >= 2.7) to add "
                                 "the CP ranks' gradients; shard over the same ranks (same_ranks=True)")
            mod.set_all_reduce_hook(lambda t, g=cp_group: dist.all_reduce(t, group=g))
    return model


def all_reduce_gradients(params, group=None):
    """Sums the gradients of `params` over `group` (e.g. the CP group of a model that is neither sharded nor
    wrapped: every CP rank holds a partial gradient). DTensor gradients reduce their local shards."""
    import torch.distributed as dist
    for p in params:
        g = p.grad
        if g is None:
            continue
        t = g.to_local() if hasattr(g, "to_local") else g
        dist.all_reduce(t, group=group)
    return params


__all__ = ["make_mesh", "fsdp_mesh", "fully_shard_model", "all_reduce_gradients"]
