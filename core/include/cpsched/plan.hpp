#pragma once
// The execution plan an executor consumes (DESIGN §7): per rank and pass, the
// attention args of each stage (CalcMeta) and the group collectives that move
// the data they need (CommMeta). Stage 0 is local; stages 1..N are remote.
#include <cstdint>
#include <vector>

#include "cpsched/mask.hpp"
#include "cpsched/problem.hpp"

namespace cpsched {

// Which buffer a range indexes: the rank's own shard (concatenation of its
// blocks in block order) or the current stage's receive buffer.
enum class BufferId : std::uint8_t { local = 0, remote = 1 };

// One attention call: q rows x k cols with a mask type, in local buffer
// coordinates. `group` is the head group (-1: all heads). Remote buffer rows
// hold only the heads of their split's group.
struct AttnArg {
  Range q;
  Range k;
  MaskType type = MaskType::full;
  BufferId q_buf = BufferId::local;
  BufferId k_buf = BufferId::local;
  int group = -1;
  friend bool operator==(const AttnArg&, const AttnArg&) = default;
};

// A group-cast (forward direction) / group-reduce (transposed) description.
// The rank's send data is cut into splits; split s is the local range
// `input_ranges[s]` (heads of `input_groups[s]`) and goes to every rank in
// `dst_indices[s]`. The receive buffer is cut into `output_split_sizes`;
// output split s comes from rank `src_index[s]`.
struct GroupCollectiveArg {
  std::vector<Token> input_split_sizes;
  std::vector<Range> input_ranges;          // local coords of each input split
  std::vector<int> input_groups;            // head group of each input split
  std::vector<std::vector<Rank>> dst_indices;
  std::vector<Token> output_split_sizes;
  std::vector<Rank> src_index;
  std::vector<int> output_groups;           // head group of each output split
  friend bool operator==(const GroupCollectiveArg&, const GroupCollectiveArg&) = default;
};

struct CalcMeta {
  std::vector<AttnArg> local_attn_args;                  // stage 0
  std::vector<std::vector<AttnArg>> remote_attn_args;    // stages 1..N
};

struct StageComm {
  Token num_remote_qo_tokens = 0;
  Token num_remote_kv_tokens = 0;
  GroupCollectiveArg qo;
  GroupCollectiveArg kv;
};

struct CommMeta {
  std::vector<StageComm> stages;  // one per remote stage
};

struct PassPlan {
  CalcMeta calc;
  CommMeta comm;
};

struct RankPlan {
  PassPlan fwd;
  PassPlan bwd;
};

struct Plan {
  int num_stages = 1;             // remote stages
  Sharding sharding;              // token layout the plan indexes
  std::vector<RankPlan> ranks;
};

}  // namespace cpsched
