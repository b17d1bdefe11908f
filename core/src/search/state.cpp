#include "cpsched/search/state.hpp"

#include <algorithm>
#include <limits>

#include <cpsched/base/error.hpp>

namespace cpsched::search {

namespace {
constexpr std::size_t kTop = 5;  // > the 4 ranks one move can touch
}

State::State(const ByteModel& model, const std::vector<Rank>& start, std::int64_t cap, double bottleneck_weight,
             const TimeObjective* time)
    : m_(&model),
      P_(model.ranks()),
      G_(model.groups()),
      words_((model.ranks() + 63) / 64),
      bottleneck_weight_(bottleneck_weight),
      cap_(cap),
      time_(time != nullptr) {
  if (time_) to_ = *time;
  const TaskGrid& g = model.grid();
  const TaskId T = g.num_tasks();
  if (static_cast<TaskId>(start.size()) != T)
    throw Error("balanced_bytes: start placement has " + std::to_string(start.size()) + " ranks for " +
                std::to_string(T) + " tasks");
  if (g.sharding().num_blocks() >= 65535)
    throw Error("balanced_bytes: more than 65534 blocks are not supported");
  info_.resize(static_cast<std::size_t>(T));
  for (TaskId t = 0; t < T; ++t) {
    const Cell& c = g.cell_of(t);
    info_[static_cast<std::size_t>(t)] = {model.unit_of(t), model.group_of(t), g.q_host(t), g.k_host(t), c.qblock,
                                          c.kblock};
  }
  const auto P = static_cast<std::size_t>(P_);
  rank_.assign(static_cast<std::size_t>(T), -1);
  load_.assign(P, 0);
  std::size_t expected = 0;
  for (TaskId t = 0; t < T; ++t) {
    const std::int32_t cell = info_[static_cast<std::size_t>(t)].cell;
    expected += model.qo_segments(cell).size() + model.kv_segments(cell).size();
  }
  cnt_.reset(static_cast<std::size_t>(model.num_segments()), G_, P_, expected);
  const auto nb = static_cast<std::size_t>(g.sharding().num_blocks());
  blk_cnt_.assign(nb * 2 * static_cast<std::size_t>(G_) * P, 0);
  holders_.assign(nb * 2 * static_cast<std::size_t>(G_) * static_cast<std::size_t>(words_), 0);
  send_.assign(P, 0.0);
  recv_.assign(P, 0.0);
  if (time_) sec_.assign(P, RankSeconds{});
  on_.assign(P, {});
  for (auto& list : on_) list.reserve(static_cast<std::size_t>(T) / P + 16);
  pos_.assign(static_cast<std::size_t>(T), -1);
  for (TaskId t = 0; t < T; ++t) {
    const Rank r = start[static_cast<std::size_t>(t)];
    if (r < 0 || r >= P_)
      throw Error("balanced_bytes: start placement puts task " + std::to_string(t) + " on rank " +
                  std::to_string(r) + " outside [0, " + std::to_string(P_) + ")");
    add(t, r, +1);
  }
  if (time_) {
    time_sum_ = 0;
    for (const RankSeconds& x : sec_) time_sum_ += x.time();
  }
  refresh_top();
  refresh_least();
}

std::int64_t State::excess() const {
  std::int64_t e = 0;
  for (std::int64_t l : load_) e += std::max<std::int64_t>(0, l - cap_);
  return e;
}

void State::refresh_least() {
  least_tree_.reset(load_);
  least_ = least_tree_.best();
}

double State::bottleneck() const {
  return top_.empty() ? 0.0 : std::max(send_[static_cast<std::size_t>(top_[0])], recv_[static_cast<std::size_t>(top_[0])]);
}

const std::uint64_t* State::words(RowKind d, TaskId t) const {
  const TaskInfo& in = info_[static_cast<std::size_t>(t)];
  const std::size_t slot = block_slot(d, d == RowKind::qo ? in.qblock : in.kblock, in.group);
  return holders_.data() + slot * static_cast<std::size_t>(words_);
}

bool State::holder(RowKind d, TaskId t, Rank r) const {
  return (words(d, t)[r / 64] >> (r % 64)) & 1U;
}

void State::add(TaskId t, Rank r, int sign) {
  const TaskInfo& in = info_[static_cast<std::size_t>(t)];
  const auto ur = static_cast<std::size_t>(r);
  for (RowKind d : {RowKind::qo, RowKind::kv}) {
    const Rank h = d == RowKind::qo ? in.qhost : in.khost;
    const auto uh = static_cast<std::size_t>(h);
    const Price& pr = m_->price(d);
    const auto segs = d == RowKind::qo ? m_->qo_segments(in.cell) : m_->kv_segments(in.cell);
    for (std::int32_t s : segs) {
      const std::uint16_t c = cnt_.bump(s, in.group, r, sign);
      const bool flips = sign > 0 ? c == 0 : c == 1;
      if (!flips || r == h) continue;
      double len = static_cast<double>(m_->segment(s).tokens.size()) * sign;
      if (time_) {
        len *= to_.byte_s[to_.link_class(h, r)];
        sec_[uh].cast_out += len * pr.out;
        sec_[ur].cast_in += len * pr.out;
        sec_[ur].red_out += len * pr.back;
        sec_[uh].red_in += len * pr.back;
      }
      send_[uh] += len * pr.out;
      recv_[ur] += len * pr.out;
      send_[ur] += len * pr.back;
      recv_[uh] += len * pr.back;
      total_ += len * pr.sum();
    }
    const std::size_t bs = block_slot(d, d == RowKind::qo ? in.qblock : in.kblock, in.group);
    std::uint32_t& bc = blk_cnt_[bs * static_cast<std::size_t>(P_) + ur];
    bc = static_cast<std::uint32_t>(static_cast<std::int64_t>(bc) + sign);
    if (r != h) {
      std::uint64_t& w = holders_[bs * static_cast<std::size_t>(words_) + ur / 64];
      const std::uint64_t bit = std::uint64_t{1} << (ur % 64);
      w = bc > 0 ? (w | bit) : (w & ~bit);
    }
  }
  load_[ur] += sign * m_->load(t);
  if (time_) {
    const double c = static_cast<double>(sign * m_->load(t)) * to_.load_s;
    sec_[ur].compute += c;
    if (in.qhost == r && in.khost == r) sec_[ur].local += c;
  }
  auto& list = on_[ur];
  if (sign > 0) {
    pos_[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(list.size());
    list.push_back(t);
    rank_[static_cast<std::size_t>(t)] = r;
  } else {
    const auto p = static_cast<std::size_t>(pos_[static_cast<std::size_t>(t)]);
    list[p] = list.back();
    pos_[static_cast<std::size_t>(list[p])] = static_cast<std::int32_t>(p);
    list.pop_back();
    rank_[static_cast<std::size_t>(t)] = -1;
  }
}

double State::RankSeconds::time() const {
  return std::max(local, std::max(cast_in, cast_out)) + (compute - local) + std::max(red_in, red_out);
}

double State::rank_time(Rank r) const { return time_ ? sec_[static_cast<std::size_t>(r)].time() : 0.0; }

double State::max_rank_time() const { return top_.empty() ? 0.0 : rank_time(top_[0]); }

double State::objective() const {
  if (!time_) return total_ + bottleneck_weight_ * P_ * bottleneck();
  return 1e9 * (max_rank_time() + to_.spread * time_sum_ / P_);
}

double State::top_value(Rank r) const {
  return time_ ? rank_time(r) : std::max(send_[static_cast<std::size_t>(r)], recv_[static_cast<std::size_t>(r)]);
}

void State::refresh_top() {
  if (bottleneck_weight_ == 0.0 && !time_) return;
  std::vector<double> v(static_cast<std::size_t>(P_));
  for (Rank r = 0; r < P_; ++r) v[static_cast<std::size_t>(r)] = top_value(r);
  top_tree_.reset(v);
  top_tree_.top(std::min<std::size_t>(kTop, static_cast<std::size_t>(P_)), top_);
}

void State::defer_top(bool deferred) {
  if (top_deferred_ && !deferred) {
    top_deferred_ = false;
    refresh_top();
  }
  top_deferred_ = deferred;
}

void State::update_ranks(const Rank* ranks, int n) {
  for (int i = 0; i < n; ++i) least_tree_.set(ranks[i], load_[static_cast<std::size_t>(ranks[i])]);
  least_ = least_tree_.best();
  if (top_deferred_ || (bottleneck_weight_ == 0.0 && !time_)) return;
  for (int i = 0; i < n; ++i) top_tree_.set(ranks[i], top_value(ranks[i]));
  top_tree_.top(std::min<std::size_t>(kTop, static_cast<std::size_t>(P_)), top_);
}

void State::move(TaskId t, Rank b) {
  const Rank a = rank(t);
  if (a == b) return;
  journal_.emplace_back(t, a);
  touch_move(t, a, b);
}

void State::rollback() {
  for (auto it = journal_.rbegin(); it != journal_.rend(); ++it) touch_move(it->first, rank(it->first), it->second);
  journal_.clear();
  refresh_top();
  refresh_least();
}

double State::delta(TaskId t, Rank b) const {
  const Rank a = rank(t);
  if (a == b) return 0.0;
  if (time_) return time_delta(t, a, b);
  const TaskInfo& in = info_[static_cast<std::size_t>(t)];
  if (bottleneck_weight_ == 0.0) {
    double d = 0.0;
    for (RowKind dir : {RowKind::qo, RowKind::kv}) {
      const Rank h = dir == RowKind::qo ? in.qhost : in.khost;
      const auto segs = dir == RowKind::qo ? m_->qo_segments(in.cell) : m_->kv_segments(in.cell);
      for (std::int32_t s : segs) {
        if (a != h && cnt_.get(s, in.group, a) == 1) d -= m_->segment_cost(s);
        if (b != h && cnt_.get(s, in.group, b) == 0) d += m_->segment_cost(s);
      }
    }
    return d;
  }
  // With the bottleneck: per-rank changes of send and recv on the (at most
  // four) ranks the move touches.
  Rank touched[4];
  double ds[4] = {0, 0, 0, 0}, dr[4] = {0, 0, 0, 0};
  int nt = 0;
  auto at = [&](Rank r) {
    for (int i = 0; i < nt; ++i)
      if (touched[i] == r) return i;
    touched[nt] = r;
    return nt++;
  };
  const int ia = at(a), ib = at(b);
  double d = 0.0;
  for (RowKind dir : {RowKind::qo, RowKind::kv}) {
    const Rank h = dir == RowKind::qo ? in.qhost : in.khost;
    const int ih = at(h);
    const Price& pr = m_->price(dir);
    auto [closed, opened] = closed_opened(in, dir, h, a, b);
    ds[ih] += (opened - closed) * pr.out;
    dr[ih] += (opened - closed) * pr.back;
    dr[ib] += opened * pr.out;
    ds[ib] += opened * pr.back;
    dr[ia] -= closed * pr.out;
    ds[ia] -= closed * pr.back;
    d += (opened - closed) * pr.sum();
  }
  double bn = 0.0;
  for (Rank r : top_) {
    bool hit = false;
    for (int i = 0; i < nt; ++i) hit = hit || touched[i] == r;
    if (!hit) {
      bn = std::max(send_[static_cast<std::size_t>(r)], recv_[static_cast<std::size_t>(r)]);
      break;
    }
  }
  for (int i = 0; i < nt; ++i) {
    const auto r = static_cast<std::size_t>(touched[i]);
    bn = std::max({bn, send_[r] + ds[i], recv_[r] + dr[i]});
  }
  return d + bottleneck_weight_ * P_ * (bn - bottleneck());
}

// Tokens of t's (segment, group) data in direction dir that a stops needing
// (t was its only task there) and that b starts to need, when t moves a -> b.
std::pair<double, double> State::closed_opened(const TaskInfo& in, RowKind dir, Rank h, Rank a, Rank b) const {
  const auto segs = dir == RowKind::qo ? m_->qo_segments(in.cell) : m_->kv_segments(in.cell);
  double closed = 0, opened = 0;
  for (std::int32_t s : segs) {
    const auto len = static_cast<double>(m_->segment(s).tokens.size());
    if (a != h && cnt_.get(s, in.group, a) == 1) closed += len;
    if (b != h && cnt_.get(s, in.group, b) == 0) opened += len;
  }
  return {closed, opened};
}

// Moves t from a to b keeping the sum of rank times (time mode) and the top list.
void State::touch_move(TaskId t, Rank a, Rank b) {
  // A move changes the loads of a and b, and the bytes of a, b and t's hosts.
  const TaskInfo& in = info_[static_cast<std::size_t>(t)];
  Rank touched[4] = {a, b, in.qhost, in.khost};
  int n = 0;
  for (Rank r : touched) {
    bool seen = false;
    for (int i = 0; i < n; ++i) seen = seen || touched[i] == r;
    if (!seen) touched[n++] = r;
  }
  if (time_)
    for (int i = 0; i < n; ++i) time_sum_ -= rank_time(touched[i]);
  add(t, a, -1);
  add(t, b, +1);
  if (time_)
    for (int i = 0; i < n; ++i) time_sum_ += rank_time(touched[i]);
  update_ranks(touched, n);
}

// Objective change of moving t from a to b in time mode: the per-rank seconds
// of the (at most four) touched ranks change; the max over the others comes
// from the top list (longer than four).
double State::time_delta(TaskId t, Rank a, Rank b) const {
  const TaskInfo& in = info_[static_cast<std::size_t>(t)];
  Rank touched[4];
  RankSeconds next[4];
  int nt = 0;
  auto at = [&](Rank r) {
    for (int i = 0; i < nt; ++i)
      if (touched[i] == r) return i;
    touched[nt] = r;
    next[nt] = sec_[static_cast<std::size_t>(r)];
    return nt++;
  };
  const int ia = at(a), ib = at(b);
  const double c = static_cast<double>(m_->load(t)) * to_.load_s;
  next[ia].compute -= c;
  if (in.qhost == a && in.khost == a) next[ia].local -= c;
  next[ib].compute += c;
  if (in.qhost == b && in.khost == b) next[ib].local += c;
  for (RowKind dir : {RowKind::qo, RowKind::kv}) {
    const Rank h = dir == RowKind::qo ? in.qhost : in.khost;
    const int ih = at(h);
    const Price& pr = m_->price(dir);
    auto [closed, opened] = closed_opened(in, dir, h, a, b);
    closed *= to_.byte_s[to_.link_class(h, a)];
    opened *= to_.byte_s[to_.link_class(h, b)];
    next[ih].cast_out += (opened - closed) * pr.out;
    next[ih].red_in += (opened - closed) * pr.back;
    next[ib].cast_in += opened * pr.out;
    next[ib].red_out += opened * pr.back;
    next[ia].cast_in -= closed * pr.out;
    next[ia].red_out -= closed * pr.back;
  }
  double mx = 0.0, dsum = 0.0;
  for (Rank r : top_) {
    bool hit = false;
    for (int i = 0; i < nt; ++i) hit = hit || touched[i] == r;
    if (!hit) {
      mx = rank_time(r);
      break;
    }
  }
  for (int i = 0; i < nt; ++i) {
    const double v = next[i].time();
    mx = std::max(mx, v);
    dsum += v - rank_time(touched[i]);
  }
  return 1e9 * ((mx - max_rank_time()) + to_.spread * dsum / P_);
}

}  // namespace cpsched::search
