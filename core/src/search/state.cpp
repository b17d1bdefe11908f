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
  if (time_) {
    to_ = *time;
    // Each rank's node once: the link class of a (host, rank) pair is read on
    // every evaluation, and node_of divides.
    node_.resize(static_cast<std::size_t>(P_));
    for (Rank r = 0; r < P_; ++r) node_[static_cast<std::size_t>(r)] = to_.nodes.node_of(r);
  }
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
  relay_ = time_ && to_.relays && to_.nodes.gpus_per_node >= 2 && P_ > to_.nodes.gpus_per_node;
  coupled_ = time_ && to_.coupled;
  if (coupled_ || relay_) rank_mark_.assign(P, 0);
  if (relay_) {
    const int nodes = node_of(P_ - 1) + 1;
    node_cnt_.reset(static_cast<std::size_t>(model.num_segments()), G_, nodes, expected);
    node_sum_.reset(static_cast<std::size_t>(model.num_segments()), G_, nodes, expected);
    pool_.assign(static_cast<std::size_t>(nodes), RankSeconds{});
    node_dirty_.assign(static_cast<std::size_t>(nodes), 0);
  }
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
    rank_time_.assign(P, 0.0);
    for (Rank r = 0; r < P_; ++r) time_sum_ += rank_time_[static_cast<std::size_t>(r)] = effective(r).time();
  }
  clear_dirty();
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
      const auto tokens = static_cast<double>(m_->segment(s).tokens.size());
      double len = tokens * sign;
      if (time_) {
        len *= to_.byte_s[link(h, r)];
        if (relay_ && link(h, r) != 0) {
          relay_add(s, in.group, h, r, sign, tokens, pr);
        } else {
          sec_[uh].cast_out += len * pr.out;
          sec_[ur].cast_in += len * pr.out;
          sec_[ur].red_out += len * pr.back;
          sec_[uh].red_in += len * pr.back;
        }
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
    const double c = sign * to_.task_seconds(t, m_->load(t));
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

State::RankSeconds& State::RankSeconds::operator+=(const RankSeconds& d) {
  compute += d.compute;
  local += d.local;
  cast_in += d.cast_in;
  cast_out += d.cast_out;
  red_in += d.red_in;
  red_out += d.red_out;
  return *this;
}

double State::RankSeconds::time() const {
  return std::max(local, std::max(cast_in, cast_out)) + (compute - local) + std::max(red_in, red_out);
}

State::RankSeconds State::effective(Rank r) const {
  const RankSeconds& own = sec_[static_cast<std::size_t>(r)];
  return relay_ ? with_pool(r, own, pool_[static_cast<std::size_t>(node_of(r))]) : own;
}

double State::rank_time(Rank r) const { return time_ ? rank_time_[static_cast<std::size_t>(r)] : 0.0; }

PortSeconds State::port_seconds(Rank r) const {
  if (!time_) return {};
  const RankSeconds x = effective(r);
  return {x.compute, x.local, x.cast_in, x.cast_out, x.red_in, x.red_out};
}

double State::part(const RankSeconds& x, int i) {
  switch (i) {
    case 0: return x.compute;
    case 1: return x.compute - x.local;
    case 2: return std::max(x.cast_in, x.cast_out);
    default: return std::max(x.red_in, x.red_out);
  }
}

double State::coupled_now() const {
  double mx[4];
  for (int i = 0; i < 4; ++i) mx[i] = part_max_[i].max();
  return coupled_step(mx);
}

// Rank r's seconds with its share of its node's pool.
State::RankSeconds State::with_pool(Rank r, const RankSeconds& own, const RankSeconds& pool) const {
  const int n = node_of(r);
  const double f = 1.0 / static_cast<double>(node_end(n) - node_begin(n));
  RankSeconds x = own;
  x.cast_in += pool.cast_in * f;
  x.cast_out += pool.cast_out * f;
  x.red_in += pool.red_in * f;
  x.red_out += pool.red_out * f;
  return x;
}

double State::max_rank_time() const {
  if (coupled_) return coupled_now();
  if (relay_) return P_ > 0 ? rank_time_[static_cast<std::size_t>(top_tree_.best())] : 0.0;
  return top_.empty() ? 0.0 : rank_time(top_[0]);
}

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
  if (!coupled_) return;
  for (int i = 0; i < 4; ++i) {
    for (Rank r = 0; r < P_; ++r) v[static_cast<std::size_t>(r)] = part(effective(r), i);
    part_max_[i].reset(v, relay_ ? to_.nodes.gpus_per_node : 1);
  }
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
  if (relay_ || coupled_) return general_time_delta(t, a, b);
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
  if (relay_ || coupled_) {
    general_touch_move(t, a, b);
    return;
  }
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
  // The touched ranks are the only ones whose seconds changed: their cached times are refreshed.
  if (time_)
    for (int i = 0; i < n; ++i) {
      const auto r = static_cast<std::size_t>(touched[i]);
      time_sum_ += rank_time_[r] = sec_[r].time();
    }
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
  const double c = to_.task_seconds(t, m_->load(t));
  next[ia].compute -= c;
  if (in.qhost == a && in.khost == a) next[ia].local -= c;
  next[ib].compute += c;
  if (in.qhost == b && in.khost == b) next[ib].local += c;
  for (RowKind dir : {RowKind::qo, RowKind::kv}) {
    const Rank h = dir == RowKind::qo ? in.qhost : in.khost;
    const int ih = at(h);
    const Price& pr = m_->price(dir);
    auto [closed, opened] = closed_opened(in, dir, h, a, b);
    closed *= to_.byte_s[link(h, a)];
    opened *= to_.byte_s[link(h, b)];
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

namespace {

// Adds a change of `recv` seconds per byte on the receiving side (cast in,
// reduce out) and `send` on the sending side (cast out, reduce in), times the
// bytes per token of each pass's direction.
template <class Seconds>
void add_ports(Seconds& x, double recv, double send, const Price& pr) {
  x.cast_in += recv * pr.out;
  x.red_out += recv * pr.back;
  x.cast_out += send * pr.out;
  x.red_in += send * pr.back;
}

}  // namespace

template <class Acc, class Pool>
void State::relay_flip(Rank h, Rank r, int sign, int others, std::uint16_t other_sum, double tokens, Acc&& acc,
                       Pool&& pool) const {
  const double sg = sign;
  const double nic = tokens * to_.byte_s[1], nvl = tokens * to_.byte_s[0];
  if (others == 0) {  // a lone holder: one direct NIC transfer, as without relays
    acc(r, sg * nic, 0.0);
    acc(h, 0.0, sg * nic);
    return;
  }
  const int n = node_of(r);
  if (others == 1) {  // the other holder goes between direct and relayed: the NIC transfer moves to the pool
    acc(static_cast<Rank>(other_sum), -sg * (nic - nvl), 0.0);
    pool(n, sg * (nic - nvl), 0.0);
  }
  pool(n, 0.0, sg * nvl);  // the relay's forward to r
  acc(r, sg * nvl, 0.0);   // r's NVLink receive
}

void State::relay_add(std::int32_t s, int g, Rank h, Rank r, int sign, double tokens, const Price& pr) {
  const int n = node_of(r);
  const int before = node_cnt_.bump(s, g, n, sign);
  const std::uint16_t sum_before = node_sum_.bump(s, g, n, sign * r);
  const int others = sign > 0 ? before : before - 1;
  const auto other_sum = static_cast<std::uint16_t>(sign > 0 ? sum_before : sum_before - r);
  relay_flip(
      h, r, sign, others, other_sum, tokens,
      [&](Rank x, double recv, double send) { add_ports(sec_[static_cast<std::size_t>(x)], recv, send, pr); },
      [&](int node, double recv, double send) { add_ports(pool_[static_cast<std::size_t>(node)], recv, send, pr); });
  if (others >= 1 && node_dirty_[static_cast<std::size_t>(n)] == 0) {
    node_dirty_[static_cast<std::size_t>(n)] = 1;
    dirty_nodes_.push_back(n);
  }
}

void State::clear_dirty() {
  for (int n : dirty_nodes_) node_dirty_[static_cast<std::size_t>(n)] = 0;
  dirty_nodes_.clear();
}

// touch_move with relays or the coupled step: the ranks whose time may change
// are a, b, t's hosts and every rank of a node whose pool or relayed holders
// changed.
void State::general_touch_move(TaskId t, Rank a, Rank b) {
  const TaskInfo& in = info_[static_cast<std::size_t>(t)];
  clear_dirty();
  add(t, a, -1);
  add(t, b, +1);
  auto refresh = [&](Rank r) {
    const RankSeconds x = effective(r);
    const double v = x.time();
    double& old = rank_time_[static_cast<std::size_t>(r)];
    if (v != old) {
      time_sum_ += v - old;
      old = v;
      if (!top_deferred_) top_tree_.set(r, v);
    }
    if (coupled_ && !top_deferred_)
      for (int i = 0; i < 4; ++i) part_max_[i].set(r, part(x, i));
  };
  for (Rank r : {a, b, in.qhost, in.khost}) refresh(r);
  for (int n : dirty_nodes_)
    for (Rank r = node_begin(n); r < node_end(n); ++r) refresh(r);
  least_tree_.set(a, load_[static_cast<std::size_t>(a)]);
  least_tree_.set(b, load_[static_cast<std::size_t>(b)]);
  least_ = least_tree_.best();
}

// time_delta with relays or the coupled step: the changes of the touched ranks and node pools are
// collected segment by segment (a's stop, then b's start, so that a and b on
// one node see each other's change of the holder count), then the touched
// ranks' times are recomputed; the slowest untouched rank comes from the top
// list (longer than the touched ranks).
double State::general_time_delta(TaskId t, Rank a, Rank b) const {
  const TaskInfo& in = info_[static_cast<std::size_t>(t)];
  d_ranks_.clear();
  d_pools_.clear();
  auto at = [&](Rank r) -> RankSeconds& {
    for (Touched& x : d_ranks_)
      if (x.rank == r) return x.d;
    d_ranks_.push_back({r, RankSeconds{}});
    return d_ranks_.back().d;
  };
  auto pool_at = [&](int n) -> RankSeconds& {
    for (auto& x : d_pools_)
      if (x.first == n) return x.second;
    d_pools_.emplace_back(n, RankSeconds{});
    return d_pools_.back().second;
  };
  const double c = to_.task_seconds(t, m_->load(t));
  at(a).compute -= c;
  if (in.qhost == a && in.khost == a) at(a).local -= c;
  at(b).compute += c;
  if (in.qhost == b && in.khost == b) at(b).local += c;
  const int na = node_of(a), nb = node_of(b);
  for (RowKind dir : {RowKind::qo, RowKind::kv}) {
    const Rank h = dir == RowKind::qo ? in.qhost : in.khost;
    const Price& pr = m_->price(dir);
    auto acc = [&](Rank x, double recv, double send) { add_ports(at(x), recv, send, pr); };
    auto pool = [&](int n, double recv, double send) { add_ports(pool_at(n), recv, send, pr); };
    const auto segs = dir == RowKind::qo ? m_->qo_segments(in.cell) : m_->kv_segments(in.cell);
    for (std::int32_t s : segs) {
      const bool close = a != h && cnt_.get(s, in.group, a) == 1;
      const bool open = b != h && cnt_.get(s, in.group, b) == 0;
      if (!close && !open) continue;
      const auto tokens = static_cast<double>(m_->segment(s).tokens.size());
      int b_others = -1;  // holders on b's node other than b, once a's stop is counted
      std::uint16_t b_sum = 0;
      if (close) {
        if (!relay_ || link(a, h) == 0) {
          const double x = tokens * to_.byte_s[link(h, a)];
          acc(a, -x, 0.0);
          acc(h, 0.0, -x);
        } else {
          const int others = node_cnt_.get(s, in.group, na) - 1;
          const auto osum = static_cast<std::uint16_t>(node_sum_.get(s, in.group, na) - a);
          relay_flip(h, a, -1, others, osum, tokens, acc, pool);
          if (nb == na) b_others = others, b_sum = osum;
        }
      }
      if (open) {
        if (!relay_ || link(b, h) == 0) {
          const double x = tokens * to_.byte_s[link(h, b)];
          acc(b, x, 0.0);
          acc(h, 0.0, x);
        } else {
          if (b_others < 0) b_others = node_cnt_.get(s, in.group, nb), b_sum = node_sum_.get(s, in.group, nb);
          relay_flip(h, b, +1, b_others, b_sum, tokens, acc, pool);
        }
      }
    }
  }
  auto dirty = [&](int n) {
    for (const auto& x : d_pools_)
      if (x.first == n) return true;
    return false;
  };
  // rank_mark_: 1 + the rank's index in d_ranks_ (0: no change of its own).
  for (std::size_t i = 0; i < d_ranks_.size(); ++i)
    rank_mark_[static_cast<std::size_t>(d_ranks_[i].rank)] = static_cast<std::int32_t>(i + 1);
  double mx = 0.0, dsum = 0.0;
  double pmx[4] = {0, 0, 0, 0};
  auto eval = [&](Rank r, const RankSeconds* pool) {
    RankSeconds x = sec_[static_cast<std::size_t>(r)];
    if (const std::int32_t i = rank_mark_[static_cast<std::size_t>(r)]; i > 0) x += d_ranks_[static_cast<std::size_t>(i - 1)].d;
    if (relay_) x = with_pool(r, x, pool ? *pool : pool_[static_cast<std::size_t>(node_of(r))]);
    const double v = x.time();
    mx = std::max(mx, v);
    if (coupled_)
      for (int i = 0; i < 4; ++i) pmx[i] = std::max(pmx[i], part(x, i));
    dsum += v - rank_time_[static_cast<std::size_t>(r)];
  };
  for (const Touched& x : d_ranks_)
    if (!dirty(node_of(x.rank))) eval(x.rank, nullptr);
  for (const auto& x : d_pools_) {
    RankSeconds pool = pool_[static_cast<std::size_t>(x.first)];
    pool += x.second;
    for (Rank r = node_begin(x.first); r < node_end(x.first); ++r) eval(r, &pool);
  }
  auto touched = [&](Rank r) { return (relay_ && dirty(node_of(r))) || rank_mark_[static_cast<std::size_t>(r)] != 0; };
  auto unmark = [&] {
    for (const Touched& x : d_ranks_) rank_mark_[static_cast<std::size_t>(x.rank)] = 0;
  };
  if (coupled_) {
    // The largest untouched value of each part: groups are nodes with relays
    // (whole nodes are touched), single ranks without.
    auto skip_group = [&](int k) { return relay_ && dirty(k); };
    auto skip_rank = [&](Rank r) { return rank_mark_[static_cast<std::size_t>(r)] != 0; };
    for (int i = 0; i < 4; ++i) pmx[i] = std::max(pmx[i], part_max_[i].max_unless(skip_group, skip_rank));
    unmark();
    return 1e9 * ((coupled_step(pmx) - coupled_now()) + to_.spread * dsum / P_);
  }
  const Rank top = top_tree_.best();
  const Rank r = touched(top) ? top_tree_.best_unless(touched) : top;
  unmark();
  if (r >= 0) mx = std::max(mx, rank_time_[static_cast<std::size_t>(r)]);
  return 1e9 * ((mx - max_rank_time()) + to_.spread * dsum / P_);
}

}  // namespace cpsched::search
