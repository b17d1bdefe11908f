"""What cpsched.torch asks of a process group, in one place.

Every collective the package issues goes through these functions: on a torch.distributed ProcessGroup they are
torch.distributed's own; a group object that serves the collectives itself (`cpsched.torch.loopback`'s: the
ranks are threads of one process) is called directly. The list is the whole contract a group must serve:
rank and size, all_to_all_single with split lists (asynchronous), all_gather of equal-shaped tensors,
all_gather_object, broadcast_object_list, and which device types it moves tensors of.
"""
from __future__ import annotations

import torch.distributed as dist


def own(g):
    """Whether `g` is a group object that serves the collectives itself (not a torch ProcessGroup)."""
    return getattr(g, "cpsched_group", False) is True


def info(group, P_plan):
    """(group, rank, size, {device type: backend name}) — without a group and without torch.distributed only a
    one-rank plan runs."""
    if own(group):
        return group, group.rank(), group.size(), group.device_types
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise ValueError("group: torch.distributed is not initialized (dist.init_process_group) but a group "
                             "was given")
        if P_plan != 1:
            raise ValueError(f"group: the plan is for P = {P_plan} ranks but torch.distributed is not initialized "
                             f"(call torch.distributed.init_process_group first, or run the ranks with "
                             f"cpsched.torch.loopback.run)")
        return None, 0, 1, None
    from ._agree import group_device_types
    g = group if group is not None else dist.group.WORLD
    return g, dist.get_rank(g), dist.get_world_size(g), group_device_types(g)


def size_of(group):
    """The size of `group` (1 without one and without torch.distributed)."""
    if own(group):
        return group.size()
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group if group is not None else dist.group.WORLD)
    return 1


def all_to_all_single(out, inp, out_splits, in_splits, g, async_op=True):
    if own(g):
        return g.all_to_all_single(out, inp, out_splits, in_splits, async_op=async_op)
    return dist.all_to_all_single(out, inp, out_splits, in_splits, group=g, async_op=async_op)


def all_gather(parts, t, g):
    if own(g):
        return g.all_gather(parts, t)
    return dist.all_gather(parts, t, group=g)


def all_gather_object(objs, obj, g):
    if own(g):
        return g.all_gather_object(objs, obj)
    return dist.all_gather_object(objs, obj, group=g)


def broadcast_object_list(objs, src, g=None):
    if own(g):
        return g.broadcast_object_list(objs, src)
    return dist.broadcast_object_list(objs, src=src, group=g)
