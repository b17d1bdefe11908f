#pragma once
// Shared pieces of the plan validator:
//   validator.cpp             entry point, shape, send/receive agreement, metrics
//   calc.cpp                  args back to global coords, exactly-once coverage
//   brute.cpp                 entry-by-entry reference for small problems
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpsched/problem/assignment.hpp"
#include "cpsched/plan/plan.hpp"
#include "cpsched/mask/slice_clip.hpp"
#include "cpsched/plan/validator.hpp"

namespace cpsched::validate_detail {

class Problems {
 public:
  Problems(std::vector<std::string>& out, std::size_t max) : out_(out), max_(max) {}
  template <class... A>
  void add(fmt::format_string<A...> f, A&&... args) {
    if (out_.size() < max_) out_.push_back(fmt::format(f, std::forward<A>(args)...));
    else ++dropped_;
  }
  std::size_t count() const { return out_.size() + dropped_; }
  void finish() {
    if (dropped_ > 0) out_.push_back(fmt::format("... and {} more problems", dropped_));
  }

 private:
  std::vector<std::string>& out_;
  std::size_t max_;
  std::size_t dropped_ = 0;
};

// Buffer rows [buf, buf + global.size()) hold the global tokens `global` of
// head group `group` (-1: every head, the local shard).
struct Segment {
  Token buf = 0;
  Range global;
  int group = -1;
};

struct BufferMap {
  std::vector<Segment> segs;  // sorted by buf, contiguous from 0
  Token size() const { return segs.empty() ? 0 : segs.back().buf + segs.back().global.size(); }
  void append(Range global, int group) {
    if (global.empty()) return;
    segs.push_back({size(), global, group});
  }
  // Calls f(buffer subrange, global begin of it, group) for the pieces of r
  // (which must lie inside [0, size())).
  template <class F>
  void walk(Range r, F&& f) const {
    auto it = std::upper_bound(segs.begin(), segs.end(), r.begin, [](Token v, const Segment& s) { return v < s.buf; });
    if (it != segs.begin()) --it;
    for (; it != segs.end() && it->buf < r.end; ++it) {
      const Range b{it->buf, it->buf + it->global.size()};
      const Range x = b.intersect(r);
      if (!x.empty()) f(x, it->global.begin + (x.begin - b.begin), it->group);
    }
  }
};

struct RankMaps {
  BufferMap local;
  BufferMap remote[2];                    // [0] QO, [1] KV: every stage's receive, in stage order
  std::vector<Token> end[2];              // end[k][s]: rows received in stages 1..s (end[k][0] = 0)
};

inline const PassPlan& pass_of(const RankPlan& r, bool fwd) { return fwd ? r.fwd : r.bwd; }
inline const char* pass_name(bool fwd) { return fwd ? "fwd" : "bwd"; }
inline const char* kind_name(int k) { return k == 0 ? "QO" : "KV"; }
inline const GroupCollectiveArg& arg_of(const StageComm& sc, int k) { return k == 0 ? sc.qo : sc.kv; }

// Shape and agreement of the CommMeta of one pass; returns the buffer maps
// (receive buffers as the senders fill them).
std::vector<RankMaps> check_comm(const Assignment& a, const Plan& plan, bool fwd, Problems& pr);

// Calc checks and coverage of one pass. Returns per rank loads (area x heads)
// of all args and of the local ones (stage 0 and the local tail), for the
// metrics check.
struct Loads {
  std::vector<std::int64_t> load, local;  // per rank: all its args, and those reading local rows only
};
// `index_chunk_pairs`: ValidateOptions::index_chunk_pairs. only >= 0: that
// rank's CalcMeta alone (validate_rank_plan): its args, the coverage of the
// tasks placed on it, its received rows read and its reduce points.
Loads check_calc(const Assignment& a, const Plan& plan, bool fwd, const std::vector<RankMaps>& maps, Problems& pr,
                 std::size_t index_chunk_pairs = 0, Rank only = -1);

// validate_plan's checks; only >= 0: of every rank's CommMeta and rank
// `only`'s CalcMeta (validate_rank_plan).
std::vector<std::string> validate_whole(const Assignment& a, const Plan& plan, const ValidateOptions& opt, Rank only);

// The pieces of arg `x` of rank `r` through the maps (no bounds checks; the
// arg must lie inside its buffers). Calls f(piece, buffer band).
template <class F>
void arg_pieces(const AttnArg& x, const RankMaps& m, F&& f) {
  const BufferMap& qm = x.q_buf == BufferId::local ? m.local : m.remote[0];
  const BufferMap& km = x.k_buf == BufferId::local ? m.local : m.remote[1];
  const Band whole = band_of(Slice{x.q, x.k, x.type});
  qm.walk(x.q, [&](Range qb, Token qg, int qgrp) {
    km.walk(x.k, [&](Range kb, Token kg, int kgrp) {
      const Band b = clip(whole, qb, kb);
      f(b.shifted(qg - qb.begin, kg - kb.begin), b, qgrp, kgrp);
    });
  });
}

}  // namespace cpsched::validate_detail
