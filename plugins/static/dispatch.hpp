#pragma once
// The static solver's pre-iteration dispatch (docs/design.md#solvers): cut the sequence
// into chunks, weigh each chunk by its area (its q rows against all keys),
// and deal the chunks largest first to the least loaded rank that still has
// room, every rank getting the same number of chunks (floor or ceil).
#include <cstdint>
#include <vector>

#include <cpsched/mask/mask.hpp>
#include <cpsched/base/range.hpp>
#include <cpsched/problem/problem.hpp>

namespace cpsched::static_solver {

// (Chunk areas: query_chunk_areas of cpsched/problem.hpp.)

// Rank of every chunk. Chunks in (area descending, position) order each go to
// the least loaded rank (lowest index on ties) with room: n / P chunks per
// rank, and n % P ranks (whichever fill first) one more.
std::vector<Rank> deal_chunks(const std::vector<Token>& areas, int cp_size);

// Node chunks to nodes, balanced and local: deal_chunks' result, then passes
// of pairwise swaps between nodes (equal counts stay equal) that keep both
// loads within (1 + kNodeSlack) x the mean (or the deal's largest load, if
// larger) and lower the keys the nodes must receive: node n receives the
// union over its chunks of `keys` (the key range each chunk's queries read)
// minus its own tokens. Without keys (all empty: index masks) a swap must
// lower the count of neighbouring chunks with area on different nodes
// instead. Chunk i is tokens [i x size, (i + 1) x size). Deterministic; at
// most 2^20 swaps are tried.
inline constexpr double kNodeSlack = 0.04;
std::vector<Rank> deal_chunks_local(const std::vector<Token>& areas, const std::vector<Range>& keys, Token size,
                                    int bins);
// The same with chunk i the tokens `ranges[i]` (chunks of any sizes).
std::vector<Rank> deal_chunks_local(const std::vector<Token>& areas, const std::vector<Range>& keys,
                                    const std::vector<Range>& ranges, int bins);

// Two-level dispatch for clusters of nodes of `node_ranks` ranks (P a
// multiple of it): the sequence is first cut into node chunks of
// `node_chunk` tokens (a multiple of `chunk`), dealt to nodes by
// deal_chunks_local (balanced area, equal counts, documents kept inside few
// nodes); then each node deals its chunks of `chunk` tokens to its own ranks
// as deal_chunks does (spreading a node's documents over its ranks is cheap
// on NVLink). Node n holds ranks [n * node_ranks, (n + 1) * node_ranks).
// `keys`: per chunk, the key range its queries read (empty: unknown).
std::vector<Rank> deal_chunks_by_node(const std::vector<Token>& areas, const std::vector<Range>& keys, Token chunk,
                                      Token node_chunk, int cp_size, int node_ranks);
// The same on chunks of any sizes (`chunks`, in position order), a node
// chunk `per` consecutive chunks.
std::vector<Rank> deal_chunks_by_node(const std::vector<Token>& areas, const std::vector<Range>& keys,
                                      const std::vector<Range>& chunks, std::size_t per, int cp_size, int node_ranks);

// Chunks of `chunk` tokens: [i x chunk, (i + 1) x chunk), the last cut at S.
std::vector<Range> uniform_chunks(Token seqlen, Token chunk);

// Chunk cuts where a kernel computes whole tiles of `tile` tokens anchored at
// each arg's origin: every cut inside a range of the mask's slices (between
// two consecutive of their q and k bounds: a document, in a document mask)
// moves to the nearest multiple of `tile` from that range's start, or to its
// end where that is nearer; each cut moves at most tile / 2 tokens, so the
// pieces of a document cut there touch no more tiles than the document.
// `chunks` as given where `tile` < 2 or a chunk is shorter than 2 x tile, and
// for index masks and masks per KV head.
std::vector<Range> tile_aligned_chunks(const Problem& p, std::vector<Range> chunks, Token tile);

// The cuts of a deal (`host`: each chunk's rank) moved to tiles, the deal
// kept: every cut between chunks on two ranks inside a range of the mask
// moves up to the next multiple of `tile` from the range's start, or to the
// range's end where that comes first (less than `tile` tokens); cuts between
// chunks on one rank stay (one block). Every block then starts and ends at a
// range's bound or a multiple of `tile` from its start, so under tiles
// anchored at each arg's origin a document's pieces touch no more tiles in
// all than as dealt (each but its last a whole number of tiles); a rank may
// take up to `tile` - 1 more rows at each of its cuts. `chunks` as given
// where tile_aligned_chunks would leave them.
std::vector<Range> tile_cuts_after_deal(const Problem& p, std::vector<Range> chunks, const std::vector<Rank>& host,
                                        Token tile);

// The most tiles of tile x tile that one rank's args touch when chunk i goes
// to host[i]: the plan's args are each slice clipped to a q block and a k
// block (neighbouring chunks on one rank make one block) as tight slices
// (hardware/task_kernel.hpp), each a ragged batch entry whose tiles are
// anchored at its origin; every task runs on its q block's host. Range masks
// (one mask for all heads). O(slices x the block pairs each one spans).
std::int64_t busiest_rank_tiles(const Problem& p, const std::vector<Range>& chunks, const std::vector<Rank>& host,
                                int cp_size, Token tile);

// Per chunk, the pairs its q rows compute (query_chunk_areas on chunks of any
// sizes): range masks only (one mask for all heads).
std::vector<Token> chunk_areas(const Problem& p, const std::vector<Range>& chunks);

// Per chunk of `chunk` tokens, the hull of the keys its queries read under the
// problem's range mask; all empty for index masks and masks per KV head.
std::vector<Range> chunk_key_ranges(const Problem& p, Token chunk);
std::vector<Range> chunk_key_ranges(const Problem& p, const std::vector<Range>& chunks);

// The sharding of the dispatch: chunks in position order, adjacent chunks of
// one rank merged into one block (the same tokens on the same rank).
Sharding dispatched_sharding(Token seqlen, Token chunk, const std::vector<Rank>& host, int cp_size);
Sharding dispatched_sharding(const std::vector<Range>& chunks, const std::vector<Rank>& host, int cp_size);

}  // namespace cpsched::static_solver
