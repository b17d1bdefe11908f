#include "transfers.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>
#include <fmt/format.h>

#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

namespace {

void check_arg(const GroupCollectiveArg& a, Rank self) {
  const std::size_t n = a.input_split_sizes.size();
  if (a.input_ranges.size() != n || a.input_groups.size() != n || a.dst_indices.size() != n)
    throw Error(fmt::format("cuda_nccl: rank {}: group-collective arg has {} input sizes but {} ranges, {} groups, "
                            "{} destination lists",
                            self, n, a.input_ranges.size(), a.input_groups.size(), a.dst_indices.size()));
  const std::size_t m = a.output_split_sizes.size();
  if (a.src_index.size() != m || a.output_groups.size() != m)
    throw Error(fmt::format("cuda_nccl: rank {}: group-collective arg has {} output sizes but {} sources, {} groups",
                            self, m, a.src_index.size(), a.output_groups.size()));
  for (std::size_t i = 0; i < n; ++i) {
    if (a.input_ranges[i].size() != a.input_split_sizes[i] || a.input_ranges[i].begin < 0)
      throw Error(fmt::format("cuda_nccl: rank {}: input split {} has size {} but range [{}, {})", self, i,
                              a.input_split_sizes[i], a.input_ranges[i].begin, a.input_ranges[i].end));
    for (Rank d : a.dst_indices[i])
      if (d == self) throw Error(fmt::format("cuda_nccl: rank {}: input split {} is sent to the rank itself", self, i));
  }
  for (std::size_t j = 0; j < m; ++j)
    if (a.src_index[j] == self)
      throw Error(fmt::format("cuda_nccl: rank {}: output split {} comes from the rank itself", self, j));
}

}  // namespace

Side packed_side(const GroupCollectiveArg& arg, std::span<const Tensor> tensors, const HeadLayout& h, Rank self) {
  check_arg(arg, self);
  Side side;
  if (tensors.empty()) return side;
  std::vector<Rank> peers;
  for (const auto& d : arg.dst_indices) peers.insert(peers.end(), d.begin(), d.end());
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  for (Rank p : peers) {
    Message m;
    m.peer = p;
    m.offset = side.bytes;
    for (Tensor t : tensors) {
      Chunk c{t, m.bytes, 0, 0};
      for (std::size_t i = 0; i < arg.dst_indices.size(); ++i) {
        const auto& d = arg.dst_indices[i];
        if (!std::binary_search(d.begin(), d.end(), p)) continue;
        const int g = arg.input_groups[i];
        const Bytes b = arg.input_split_sizes[i] * h.row_bytes(t, g);
        m.segments.push_back({t, static_cast<int>(i), g, arg.input_ranges[i].begin, arg.input_split_sizes[i],
                              m.bytes, b});
        m.bytes += b;
      }
      c.bytes = m.bytes - c.offset;
      m.chunks.push_back(c);
    }
    side.bytes += m.bytes;
    side.messages.push_back(std::move(m));
  }
  return side;
}

Side buffer_side(const GroupCollectiveArg& arg, Token recv_offset, std::span<const Tensor> tensors,
                 const HeadLayout& h, Rank self) {
  check_arg(arg, self);
  Side side;
  if (tensors.empty()) return side;
  const std::size_t m = arg.output_split_sizes.size();
  for (std::size_t j = 1; j < m; ++j) {
    if (arg.src_index[j] < arg.src_index[j - 1])
      throw Error(fmt::format("cuda_nccl: rank {}: output split {} (from rank {}) follows a split from rank {}: "
                              "output splits must be ordered by source",
                              self, j, arg.src_index[j], arg.src_index[j - 1]));
    if ((arg.output_groups[j] < 0) != (arg.output_groups[0] < 0))
      throw Error(fmt::format("cuda_nccl: rank {}: output splits mix head group -1 and head groups >= 0", self));
  }
  // Start row of every split: the stage's receive buffer is their concatenation.
  std::vector<Token> row(m + 1, recv_offset);
  for (std::size_t j = 0; j < m; ++j) row[j + 1] = row[j] + arg.output_split_sizes[j];
  for (std::size_t j0 = 0; j0 < m;) {
    std::size_t j1 = j0;
    while (j1 < m && arg.src_index[j1] == arg.src_index[j0]) ++j1;
    Message msg;
    msg.peer = arg.src_index[j0];
    for (Tensor t : tensors) {
      Chunk c{t, msg.bytes, 0, row[j0]};
      for (std::size_t j = j0; j < j1; ++j) {
        const int g = arg.output_groups[j];
        const Bytes b = arg.output_split_sizes[j] * h.row_bytes(t, g);
        msg.segments.push_back({t, static_cast<int>(j), g, row[j], arg.output_split_sizes[j], msg.bytes, b});
        msg.bytes += b;
      }
      c.bytes = msg.bytes - c.offset;
      msg.chunks.push_back(c);
    }
    side.bytes += msg.bytes;
    if (msg.bytes > 0) side.messages.push_back(std::move(msg));
    j0 = j1;
  }
  return side;
}

PassLists translate(const PassPlan& plan, Pass pass, const HeadLayout& h, Rank self) {
  PassLists out;
  out.pass = pass;
  for (std::size_t s = 0; s < plan.comm.stages.size(); ++s) {
    const StageComm& sc = plan.comm.stages[s];
    StageLists st;
    st.stage = static_cast<int>(s) + 1;
    auto fill = [&](KindLists& k, const GroupCollectiveArg& arg, Token recv_offset, RowKind kind) {
      k.cast_send = packed_side(arg, cast_tensors(pass, kind, h.shared), h, self);
      k.cast_recv = buffer_side(arg, recv_offset, cast_tensors(pass, kind, h.shared), h, self);
      k.reduce_send = buffer_side(arg, recv_offset, reduce_tensors(pass, kind, h.shared), h, self);
      k.reduce_recv = packed_side(arg, reduce_tensors(pass, kind, h.shared), h, self);
    };
    fill(st.qo, sc.qo, sc.qo_recv_offset, RowKind::qo);
    fill(st.kv, sc.kv, sc.kv_recv_offset, RowKind::kv);
    Token qo = first_phase_tokens(sc.qo), kv = first_phase_tokens(sc.kv);
    // Forwarding phase: sends rows of the stage's first-phase receive, receives after it.
    auto fill_fwd = [&](KindLists& k, const GroupCollectiveArg& arg, Token recv_offset, Token first, RowKind kind) {
      for (std::size_t i = 0; i < arg.input_ranges.size(); ++i)
        if (arg.input_ranges[i].end > first || arg.input_ranges[i].begin < 0)
          throw Error(fmt::format("cuda_nccl: rank {} {} stage {}: forwarding input split {} [{}, {}) is outside the "
                                  "stage's {} first-phase {} rows",
                                  self, to_string(pass), s + 1, i, arg.input_ranges[i].begin, arg.input_ranges[i].end,
                                  first, to_string(kind)));
      k.cast_send = packed_side(arg, cast_tensors(pass, kind, h.shared), h, self);
      k.cast_recv = buffer_side(arg, recv_offset + first, cast_tensors(pass, kind, h.shared), h, self);
      k.reduce_send = buffer_side(arg, recv_offset + first, reduce_tensors(pass, kind, h.shared), h, self);
      k.reduce_recv = packed_side(arg, reduce_tensors(pass, kind, h.shared), h, self);
    };
    fill_fwd(st.qo_fwd, sc.qo_fwd, sc.qo_recv_offset, qo, RowKind::qo);
    fill_fwd(st.kv_fwd, sc.kv_fwd, sc.kv_recv_offset, kv, RowKind::kv);
    qo += first_phase_tokens(sc.qo_fwd);
    kv += first_phase_tokens(sc.kv_fwd);
    if (qo != sc.num_remote_qo_tokens || kv != sc.num_remote_kv_tokens)
      throw Error(fmt::format("cuda_nccl: rank {} {} stage {}: receives {} QO and {} KV rows but the stage says {} and {}",
                              self, to_string(pass), s + 1, qo, kv, sc.num_remote_qo_tokens,
                              sc.num_remote_kv_tokens));
    out.stages.push_back(std::move(st));
  }
  return out;
}

std::vector<WireOp> wire_ops(const PassLists& fwd, const PassLists& bwd, Rank self) {
  std::vector<WireOp> out;
  for (const PassLists* pl : {&fwd, &bwd})
    for (const StageLists& st : pl->stages)
      // Issue order: cast, forwarding cast, forwarding reduce, reduce.
      for (int phase : {0, 2, 3, 1})
        for (RowKind kind : {RowKind::qo, RowKind::kv}) {
          const KindLists& k = phase >= 2 ? st.fwd_of(kind) : st.of(kind);
          const bool cast = phase == 0 || phase == 2;
          const Side* sides[2] = {cast ? &k.cast_send : &k.reduce_send, cast ? &k.cast_recv : &k.reduce_recv};
          for (int dir = 0; dir < 2; ++dir)
            for (const Message& m : sides[dir]->messages)
              for (const Chunk& c : m.chunks)
                if (c.bytes > 0)
                  out.push_back({static_cast<std::int8_t>(pl->pass), static_cast<std::int8_t>(kind),
                                 static_cast<std::int8_t>(phase), static_cast<std::int8_t>(dir == 0), st.stage, self,
                                 m.peer, static_cast<std::int32_t>(c.tensor), c.bytes});
        }
  return out;
}

std::vector<std::string> cross_check(const std::vector<std::vector<WireOp>>& per_rank) {
  using Key = std::tuple<int, int, int, int, Rank, Rank>;  // pass, stage, kind, phase, src, dst
  std::map<Key, std::vector<std::pair<int, Bytes>>> sends, recvs;
  for (const auto& ops : per_rank)
    for (const WireOp& w : ops) {
      const Rank src = w.send ? w.self : w.peer, dst = w.send ? w.peer : w.self;
      (w.send ? sends : recvs)[Key{w.pass, w.stage, w.kind, w.phase, src, dst}].push_back({w.tensor, w.bytes});
    }
  std::vector<std::string> problems;
  auto describe = [](const Key& k) {
    return fmt::format("{} stage {} {} {} from rank {} to rank {}", to_string(static_cast<Pass>(std::get<0>(k))),
                       std::get<1>(k), to_string(static_cast<RowKind>(std::get<2>(k))),
                       std::array<const char*, 4>{"group-cast", "group-reduce", "forwarding group-cast",
                                                  "forwarding group-reduce"}[static_cast<std::size_t>(std::get<3>(k) & 3)],
                       std::get<4>(k), std::get<5>(k));
  };
  auto calls = [](const std::vector<std::pair<int, Bytes>>& v) {
    std::string s;
    for (const auto& [t, b] : v) s += fmt::format("{}{}:{}", s.empty() ? "" : " ", to_string(static_cast<Tensor>(t)), b);
    return s.empty() ? std::string("nothing") : s;
  };
  for (const auto& [k, v] : sends) {
    auto it = recvs.find(k);
    const std::vector<std::pair<int, Bytes>> none;
    const auto& r = it == recvs.end() ? none : it->second;
    if (v != r) problems.push_back(fmt::format("{}: sends {} but receives {}", describe(k), calls(v), calls(r)));
  }
  for (const auto& [k, r] : recvs)
    if (!sends.count(k)) problems.push_back(fmt::format("{}: receives {} but nothing is sent", describe(k), calls(r)));
  return problems;
}

}  // namespace cpsched::gpu
