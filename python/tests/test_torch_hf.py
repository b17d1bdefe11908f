"""cpsched.torch's transformers integration in one process (P = 1): the documents and masks of a packed
batch, the attention function against the model's own `sdpa` attention, one plan per distinct mask, torch.compile
without a graph break, and the errors. The distributed cases are in test_torch_hf_dist.py."""
import copy
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cpsched.torch.integrations.transformers as hf  # noqa: E402
from cpsched.torch.integrations import documents as docs  # noqa: E402
from cpsched.torch.reference import mask_matrix  # noqa: E402
from torch_hf_ranks import LENGTHS, build, llama_config, loss_of, packed, qwen2_config  # noqa: E402

torch.set_num_threads(1)


def dense_window_mask(lengths, window, causal=True):
    """bool [S, S] written out: same document, key <= query (causal), query - key < window."""
    S = sum(lengths)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    m = doc[:, None] == doc[None, :]
    if causal:
        m &= j <= i
    if window is not None:
        m &= i - j < window
    return m


# ---- documents and masks ----------------------------------------------------------------------------


def test_documents_follow_transformers_packed_sequence_rule():
    from transformers.masking_utils import find_packed_sequence_indices
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(1, 9, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist()
        pos = torch.cat([torch.arange(n) for n in lengths])[None]
        b = docs.bounds_from_position_ids(pos)
        assert b.tolist() == [0] + np.cumsum(lengths).tolist()
        seq = find_packed_sequence_indices(pos)
        want = np.zeros(sum(lengths), dtype=np.int64) if seq is None else seq[0].numpy()
        got = np.repeat(np.arange(len(b) - 1), np.diff(b))
        assert (got == want).all()
        assert (docs.bounds_from_cu_seqlens(torch.tensor(b)) == b).all()
        assert torch.equal(docs.position_ids_of(b), pos[0])


def test_document_masks_equal_their_definition():
    g = torch.Generator().manual_seed(1)
    for trial in range(30):
        lengths = torch.randint(1, 14, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
        b = docs.bounds_from_cu_seqlens(np.concatenate([[0], np.cumsum(lengths)]))
        for window, causal in ((None, True), (None, False), (1, True), (2, True), (5, True), (100, True)):
            q, k, t = docs.document_mask(b, window, causal)
            got = mask_matrix(q, k, t, sum(lengths))
            assert torch.equal(got, dense_window_mask(lengths, window, causal)), (lengths, window, causal)
    # a window at least as long as every document is the causal mask itself (its layers share the plan)
    b = np.array([0, 5, 12])
    assert docs.mask_digest(*docs.document_mask(b, 7)) == docs.mask_digest(*docs.document_mask(b, None))
    assert docs.mask_digest(*docs.document_mask(b, 6)) != docs.mask_digest(*docs.document_mask(b, None))


@pytest.mark.parametrize("bad, match", [
    (dict(position_ids=torch.zeros(2, 8, dtype=torch.long)), "position_ids: expected shape"),
    (dict(position_ids=torch.zeros(8)), "integer token positions"),
    (dict(cu_seqlens=[1, 4]), "must start at 0"),
    (dict(cu_seqlens=[0, 5, 3]), "non-decreasing"),
    (dict(cu_seqlens=[0]), "at least 2 entries"),
])
def test_batch_errors_name_the_argument(bad, match):
    cp = hf.ContextParallel(build(llama_config(), "cpsched"))
    with pytest.raises(ValueError, match=match):
        cp.set_batch(**bad)


def test_shard_cuts_every_tensor_and_sets_the_step():
    cp = hf.ContextParallel(build(llama_config(), "cpsched"))
    ids, pos, labels = packed(LENGTHS[0], 0)
    out = cp.shard(position_ids=pos, input_ids=ids, labels=labels[0])
    assert torch.equal(out["input_ids"], ids) and torch.equal(out["labels"], labels[0])
    assert cp.step.documents == len(LENGTHS[0]) and cp.step.seqlen == sum(LENGTHS[0])
    out = cp.shard(cu_seqlens=cp.step.bounds, input_ids=ids)
    assert torch.equal(out["position_ids"], pos)
    with pytest.raises(ValueError, match="input_ids: expected shape"):
        cp.shard(position_ids=pos, input_ids=ids[:, :-1])


# ---- against transformers' own attention ------------------------------------------------------------


def _pair(config):
    ref = build(config, "sdpa")
    m = build(config, "cpsched")
    return ref, m, hf.ContextParallel(m)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("via", ["position_ids", "cu_seqlens"])
def test_matches_the_models_sdpa_at_one_rank(name, via):
    """The whole model, logits and every parameter's gradient, against the same model with attn_implementation
    "sdpa" on the packed sequence (transformers' packed-sequence mask); Qwen2 with sliding-window layers."""
    cfg = llama_config() if name == "llama" else qwen2_config(window=5)
    ref, m, cp = _pair(cfg)
    ids, pos, labels = packed(LENGTHS[0], 1)
    count = (labels >= 0).sum()
    a = ref(input_ids=ids, position_ids=pos).logits
    if via == "position_ids":
        local = cp.shard(position_ids=pos, input_ids=ids)
    else:
        local = cp.shard(cu_seqlens=np.concatenate([[0], np.cumsum(LENGTHS[0])]), input_ids=ids)
    b = m(input_ids=local["input_ids"], position_ids=local["position_ids"]).logits
    assert (a - b).abs().max().item() < 1e-5
    loss_of(a, labels, count).backward()
    loss_of(b, labels, count).backward()
    for (n, p), q in zip(ref.named_parameters(), m.parameters()):
        assert (p.grad - q.grad).abs().max().item() <= 1e-5 * (1 + p.grad.abs().max().item()), n


def test_attention_function_follows_the_contract():
    """Called as transformers calls it: query [1, Hq, L, D] and key / value [1, Hkv, L, D] as the layer's
    transposed views; returns ([1, L, Hq, D] contiguous, None), equal to transformers' sdpa function's."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers import AttentionInterface
    assert AttentionInterface._global_mapping["cpsched"] is hf.cpsched_attention
    m = build(llama_config(), "cpsched")
    cp = hf.ContextParallel(m)
    module = m.model.layers[0].self_attn
    L, hq, hkv, d = 24, 4, 2, 16
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, L, hq, d, generator=g).transpose(1, 2)
    k = torch.randn(1, L, hkv, d, generator=g).transpose(1, 2)
    v = torch.randn(1, L, hkv, d, generator=g).transpose(1, 2)
    pos = torch.arange(L)[None]
    cp.set_batch(pos)
    out, w = hf.cpsched_attention(module, q, k, v, None, dropout=0.0, scaling=0.3, position_ids=pos)
    ref, _ = sdpa_attention_forward(module, q, k, v, None, dropout=0.0, scaling=0.3)
    assert w is None and out.shape == (1, L, hq, d) and out.is_contiguous()
    assert (out - ref).abs().max().item() < 1e-5


def test_one_plan_per_distinct_mask_per_step():
    """Qwen2 with full and sliding layers: 2 solves per step for 4 layers, none for the backward; a window
    longer than every document is the causal mask (1 solve); a batch seen again is served from the cache."""
    m = build(qwen2_config(layers=4, window=5), "cpsched")
    cp = hf.ContextParallel(m)
    for i, lengths in enumerate(LENGTHS):
        ids, pos, labels = packed(lengths, i)
        local = cp.shard(position_ids=pos, input_ids=ids)
        loss_of(m(**local).logits, labels, 1).backward()
        assert cp.stats["solves"] == 2 * (i + 1), cp.stats
    assert cp.stats["calls"] == 8 and cp.stats["step_hits"] == 4
    local = cp.shard(position_ids=packed(LENGTHS[0], 0)[1], input_ids=packed(LENGTHS[0], 0)[0])
    m(**local)
    assert cp.stats["solves"] == 4 and cp.stats["cache_hits"] == 2
    wide = build(qwen2_config(layers=4, window=max(max(x) for x in LENGTHS)), "cpsched")
    cpw = hf.ContextParallel(wide)
    ids, pos, _ = packed(LENGTHS[0], 0)
    wide(**cpw.shard(position_ids=pos, input_ids=ids))
    assert cpw.stats["solves"] == 1 and cpw.stats["step_hits"] == 3


def test_compiled_model_has_no_graph_break():
    """torch.compile(fullgraph=True): the attention layers are the custom operator cpsched::cp_attention; no
    graph break, one graph for two steps of other documents, the eager model's logits and gradients."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    cfg = qwen2_config(layers=2, window=5)  # a full and a sliding layer
    eager, m = build(cfg, "cpsched"), build(cfg, "cpsched")
    cpe, cpc = hf.ContextParallel(eager), hf.ContextParallel(m)
    run = torch.compile(m, backend="aot_eager", fullgraph=True)
    for i, lengths in enumerate(LENGTHS):
        ids, pos, labels = packed(lengths, i)
        a = eager(**cpe.shard(position_ids=pos, input_ids=ids)).logits
        b = run(**cpc.shard(position_ids=pos, input_ids=ids)).logits
        assert (a - b).abs().max().item() < 1e-6
        loss_of(a, labels, 1).backward()
        loss_of(b, labels, 1).backward()
    for (n, p), q in zip(eager.named_parameters(), m.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6), n
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert cpc.stats["solves"] == cpe.stats["solves"] == 4


# ---- errors ------------------------------------------------------------------------------------------


def _local(cp, i=0):
    ids, pos, _ = packed(LENGTHS[i], i)
    return cp.shard(position_ids=pos, input_ids=ids)


def test_errors_name_what_is_wrong():
    cfg = llama_config()
    m = build(cfg, "cpsched")
    cp = hf.ContextParallel(m)
    with pytest.raises(ValueError, match="no batch for this step"):
        m(input_ids=torch.zeros(1, 8, dtype=torch.long))
    local = _local(cp)
    with pytest.raises(ValueError, match="batch size 2"):
        m(input_ids=local["input_ids"].repeat(2, 1), position_ids=local["position_ids"].repeat(2, 1))
    with pytest.raises(ValueError, match="attention_mask: the 2-D mask has padding"):
        am = torch.ones_like(local["input_ids"])
        am[0, -3:] = 0
        m(**local, attention_mask=am)
    m(**local, attention_mask=torch.ones_like(local["input_ids"]))  # no padding: accepted
    stale = _local(hf.ContextParallel(build(cfg, "cpsched")), 1)  # another step's batch, not given to cp
    with pytest.raises(ValueError, match="not this rank's rows"):
        m(input_ids=stale["input_ids"][:, :96], position_ids=stale["position_ids"][:, :96])
    with pytest.raises(ValueError, match="position_ids: the model got shape"):
        m(input_ids=local["input_ids"][:, :50], position_ids=local["position_ids"][:, :50])
    drop = copy.deepcopy(cfg)
    drop.attention_dropout = 0.1
    md = build(drop, "cpsched")
    cpd = hf.ContextParallel(md)
    md.train()
    with pytest.raises(ValueError, match="dropout"):
        md(**_local(cpd))
    unbound = build(cfg, "cpsched")
    with pytest.raises(ValueError, match="no cpsched ContextParallel is bound"):
        unbound(**local)
    with pytest.raises(ValueError, match="attn_implementation is 'sdpa'"):
        hf.ContextParallel(build(cfg, "sdpa"))
    with pytest.raises(ValueError, match="cp_size: ContextParallel sets"):
        hf.ContextParallel(m, cp_size=2)
