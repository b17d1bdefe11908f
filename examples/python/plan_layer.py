"""Plan one attention layer of a packed-document batch and print rank 0's CommMeta.

    pip install .                       # from the repository root
    python examples/python/plan_layer.py

A training loop does the same per layer: the documents of the packed sequence give a causal
document mask as the seed's three lists (q_ranges, k_ranges, mask types); the Session returns the
plan for every rank; each rank reads its own CalcMeta (attention calls) and CommMeta (group
collectives). A repeated mask (the next layer, the next step with the same packing) is a cache hit.
"""
import numpy as np

import cpsched

CP = 8                    # context-parallel ranks
SEQLEN = CP * 8192        # 8192 tokens per rank
HEADS = (64, 8, 128, "bf16")  # GQA 64:8, D = 128, bf16

# A packed batch: documents of random lengths (fixed seed) filling the sequence.
rng = np.random.default_rng(7)
lengths = []
while sum(lengths) < SEQLEN:
    lengths.append(int(min(rng.integers(512, 16384), SEQLEN - sum(lengths))))
ends = np.cumsum(lengths)
starts = ends - np.array(lengths)
ranges = np.stack([starts, ends], axis=1)         # each document attends to itself ...
types = np.full(len(lengths), 1, dtype=np.int32)  # ... causally (1 = causal)

session = cpsched.Session(cp_size=CP, seqlen=SEQLEN, heads=HEADS, solver="balanced_bytes", stages=1)
result = session.solve(ranges, ranges, types)
m = result.metrics
print(f"{len(lengths)} documents, S = {SEQLEN}, P = {CP}: solved by {result.solver} in {result.call_ms:.1f} ms")
print(f"forward send {m['fwd']['total_send'] / 2**30:.3f} GiB, imbalance {m['imbalance']:.3f}, "
      f"stage-0 share {100 * m['stage0_share']:.1f} %")

calc = result.calc_meta(0)
print(f"\nrank 0 CalcMeta: {len(calc.local_attn_args)} local attention call(s), "
      f"{[len(a) for a in calc.remote_attn_args]} remote per stage")
comm = result.comm_meta(0)
print("rank 0 CommMeta (forward):")
for s, st in enumerate(comm.stages, start=1):
    print(f"  stage {s}: receives {st.num_remote_qo_tokens} QO and {st.num_remote_kv_tokens} KV tokens")
    for kind, arg in (("QO", st.qo), ("KV", st.kv)):
        print(f"    {kind} group-cast: input_split_sizes {arg.input_split_sizes.tolist()}")
        print(f"    {kind}             dst_indices       {arg.dst_indices_list}")
        print(f"    {kind}             output_split_sizes {arg.output_split_sizes.tolist()}")
        print(f"    {kind}             src_index         {arg.src_index.tolist()}")

again = session.solve(ranges, ranges, types)
print(f"\nthe same mask again: cache hit = {again.cached}, {1000 * again.call_ms:.1f} us in C++")
