#pragma once
// The static solver's pre-iteration dispatch (DESIGN §6): cut the sequence
// into chunks, weigh each chunk by its area (its q rows against all keys),
// and deal the chunks largest first to the least loaded rank that still has
// room, every rank getting the same number of chunks (floor or ceil).
#include <cstdint>
#include <vector>

#include <cpsched/mask.hpp>
#include <cpsched/problem.hpp>

namespace cpsched::static_solver {

// (Chunk areas: query_chunk_areas of cpsched/problem.hpp.)

// Rank of every chunk. Chunks in (area descending, position) order each go to
// the least loaded rank (lowest index on ties) with room: n / P chunks per
// rank, and n % P ranks (whichever fill first) one more.
std::vector<Rank> deal_chunks(const std::vector<Token>& areas, int cp_size);

// Two-level dispatch for clusters of nodes of `node_ranks` ranks (P a
// multiple of it): the sequence is first cut into node chunks of
// `node_chunk` tokens (a multiple of `chunk`), dealt to nodes as deal_chunks
// deals to ranks (balanced area, equal counts), so that a document stays
// inside few nodes; then each node deals its chunks of `chunk` tokens to its
// own ranks. Node n holds ranks [n * node_ranks, (n + 1) * node_ranks).
std::vector<Rank> deal_chunks_by_node(const std::vector<Token>& areas, Token chunk, Token node_chunk, int cp_size,
                                      int node_ranks);

// The sharding of the dispatch: chunks in position order, adjacent chunks of
// one rank merged into one block (the same tokens on the same rank).
Sharding dispatched_sharding(Token seqlen, Token chunk, const std::vector<Rank>& host, int cp_size);

}  // namespace cpsched::static_solver
