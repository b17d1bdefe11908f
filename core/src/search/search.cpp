#include "cpsched/search/search.hpp"

#include <algorithm>
#include <limits>
#include <queue>

namespace cpsched::search {

namespace {

constexpr double kEps = 1e-6;  // bytes: objective changes below this are ties

// Holders tried per task: every one up to P = 64; at larger P a cyclic
// window of this many, starting at a rank that varies with the task, so that
// one evaluation costs O(1) however many ranks share a block (at P = 1024 a
// kv block of a sparse mask has hundreds of holders).
constexpr int kMaxHolderCandidates = 64;

// The ranks worth trying for task t: its hosts, the ranks that already hold
// its q- or kv-block data of its group (at most kMaxHolderCandidates), and
// (for repair) the least loaded.
template <class F>
void for_each_candidate(const State& st, TaskId t, bool with_least_loaded, F&& f) {
  const TaskGrid& g = st.model().grid();
  const Rank qh = g.q_host(t), kh = g.k_host(t);
  f(qh);
  if (kh != qh) f(kh);
  auto other = [&](Rank r) {
    if (r != qh && r != kh) f(r);
  };
  if (st.ranks() <= kMaxHolderCandidates) st.for_each_holder(t, other);
  else st.for_each_holder_from(t, static_cast<Rank>((t * 37 + st.rank(t)) % st.ranks()), kMaxHolderCandidates, other);
  if (with_least_loaded) {
    const Rank r = st.least_loaded();
    if (r != qh && r != kh && !st.holds_q(t, r) && !st.holds_kv(t, r)) f(r);
  }
}

struct Best {
  double value = std::numeric_limits<double>::infinity();
  Rank rank = -1;
};

// Cheapest destination of t with room for it, as objective change per load.
Best best_ratio(const State& st, TaskId t, Budget& budget) {
  const std::int64_t L = st.model().load(t);
  const Rank a = st.rank(t);
  Best best;
  for_each_candidate(st, t, true, [&](Rank r) {
    if (r == a || st.load(r) + L > st.cap()) return;
    --budget.left;
    const double v = st.delta(t, r) / static_cast<double>(std::max<std::int64_t>(L, 1));
    if (v < best.value) best = {v, r};
  });
  return best;
}

// Tasks on rank a that share t's q block (QO) or kv block (KV) and group, at
// most `limit` of them (in cell order): a block of a large grid has thousands
// of cells, and re-pricing them all after every move made repair quadratic.
template <class F>
void for_each_sibling(const State& st, TaskId t, Rank a, bool qo, bool kv, int limit, F&& f) {
  const ByteModel& m = st.model();
  const int G = m.groups(), g = m.group_of(t);
  const Cell& c = m.grid().cell_of(t);
  int n = 0;
  for (RowKind d : {RowKind::qo, RowKind::kv}) {
    if (!(d == RowKind::qo ? qo : kv)) continue;
    for (std::int32_t cell : m.cells_of(d, d == RowKind::qo ? c.qblock : c.kblock)) {
      const TaskId s = static_cast<TaskId>(cell) * G + g;
      if (s == t || st.rank(s) != a) continue;
      if (n++ == limit) return;
      f(s);
    }
  }
}

// Siblings re-priced after a repair move.
constexpr int kMaxSiblings = 64;

// Per-task keys of the repair's priority queue, reused across ranks: a
// version stamp tells a live heap entry from a stale one.
struct RepairScratch {
  std::vector<std::uint32_t> version;
  std::vector<double> key;
};

// Time mode: repair stops after this many evaluations (see repair()).
constexpr std::int64_t kTimeRepairEvaluations = 2000000;

// Stops early when the budget falls below `floor`.
bool repair_rank(State& st, Rank a, Budget& budget, RepairScratch& scratch, std::int64_t floor) {
  struct Item {
    double key;
    TaskId t;
    std::uint32_t version;
    bool operator>(const Item& o) const { return key != o.key ? key > o.key : t > o.t; }
  };
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  auto& version = scratch.version;
  auto& key = scratch.key;
  for (TaskId t : st.tasks_on(a)) key[static_cast<std::size_t>(t)] = std::numeric_limits<double>::infinity();
  auto push = [&](TaskId t, double k) {
    key[static_cast<std::size_t>(t)] = k;
    heap.push({k, t, ++version[static_cast<std::size_t>(t)]});
  };
  for (TaskId t : std::vector<TaskId>(st.tasks_on(a))) {
    const Best b = best_ratio(st, t, budget);
    if (b.rank >= 0) push(t, b.value);
  }
  while (st.load(a) > st.cap() && !heap.empty()) {
    if (budget.left < floor) break;
    const Item it = heap.top();
    heap.pop();
    if (it.version != version[static_cast<std::size_t>(it.t)] || st.rank(it.t) != a) continue;
    const Best b = best_ratio(st, it.t, budget);
    if (b.rank < 0) continue;
    if (b.value > it.key && !heap.empty() && b.value > heap.top().key) {
      push(it.t, b.value);
      continue;
    }
    // Where the move brings t's q-block (kv-block) data to b for the first
    // time, the siblings sharing it get cheaper to send there: re-price that
    // one destination for them.
    const TaskGrid& g = st.model().grid();
    const bool new_q = b.rank != g.q_host(it.t) && !st.holds_q(it.t, b.rank);
    const bool new_kv = b.rank != g.k_host(it.t) && !st.holds_kv(it.t, b.rank);
    st.move(it.t, b.rank);
    for_each_sibling(st, it.t, a, new_q, new_kv, kMaxSiblings, [&](TaskId s) {
      const std::int64_t L = st.model().load(s);
      if (st.load(b.rank) + L > st.cap()) return;
      --budget.left;
      const double v = st.delta(s, b.rank) / static_cast<double>(std::max<std::int64_t>(L, 1));
      if (v < key[static_cast<std::size_t>(s)]) push(s, v);
    });
  }
  return st.load(a) <= st.cap();
}

}  // namespace

namespace {

// Moves tasks off ranks above the cap, without pricing: what is left of a
// repair once its priced evaluations are spent. Each goes to the first of its
// hosts and holders with room, else to the least loaded rank with room.
// O(tasks moved x (holders + log P)) plus O(P) per rank repaired.
bool repair_unpriced(State& st) {
  // Nothing here reads the slowest ranks: their list is rebuilt once at the end.
  struct Deferred {
    State& s;
    explicit Deferred(State& x) : s(x) { s.defer_top(true); }
    ~Deferred() { s.defer_top(false); }
    Deferred(const Deferred&) = delete;
    Deferred& operator=(const Deferred&) = delete;
  } deferred(st);
  std::vector<TaskId> tasks;
  // Largest tasks first (ties by task): fewest moves. A heap, since only the
  // tasks moved until the rank is under the cap are ever taken from it.
  auto after = [&](TaskId x, TaskId y) {
    const std::int64_t lx = st.model().load(x), ly = st.model().load(y);
    return lx != ly ? lx < ly : x > y;
  };
  for (;;) {
    Rank worst = -1;
    for (Rank r = 0; r < st.ranks(); ++r)
      if (st.load(r) > st.cap() && (worst < 0 || st.load(r) > st.load(worst))) worst = r;
    if (worst < 0) return true;
    tasks = st.tasks_on(worst);
    std::make_heap(tasks.begin(), tasks.end(), after);
    bool moved = false;
    while (!tasks.empty()) {
      if (st.load(worst) <= st.cap()) break;
      std::pop_heap(tasks.begin(), tasks.end(), after);
      const TaskId t = tasks.back();
      tasks.pop_back();
      // Where its data already is (a host or a holder of its blocks) if one
      // has room, else the least loaded: the tasks of a heavy row then
      // follow each other instead of scattering their data over many ranks.
      const std::int64_t L = st.model().load(t);
      Rank b = -1;
      for_each_candidate(st, t, false, [&](Rank r) {
        if (b < 0 && r != worst && st.load(r) + L <= st.cap()) b = r;
      });
      if (b < 0) b = st.least_loaded();
      if (b == worst || st.load(b) + L > st.cap()) continue;
      st.move(t, b);
      moved = true;
    }
    if (st.load(worst) > st.cap() && !moved) return false;
  }
}

}  // namespace

namespace {

// repair() with at most `limit` priced evaluations; past them, the rest moves
// unpriced where `unpriced_rest`, else it returns false.
bool repair_within(State& st, Budget& budget, std::int64_t limit, bool unpriced_rest) {
  const auto T = static_cast<std::size_t>(st.model().tasks());
  const std::int64_t floor = budget.left - limit;
  RepairScratch scratch;
  scratch.version.assign(T, 0);
  scratch.key.assign(T, std::numeric_limits<double>::infinity());
  for (;;) {
    Rank worst = -1;
    for (Rank r = 0; r < st.ranks(); ++r)
      if (st.load(r) > st.cap() && (worst < 0 || st.load(r) > st.load(worst))) worst = r;
    if (worst < 0) return true;
    if (budget.left < floor) return unpriced_rest && repair_unpriced(st);
    if (!repair_rank(st, worst, budget, scratch, floor))
      return budget.left < floor && unpriced_rest ? repair_unpriced(st) : false;
  }
}

}  // namespace

bool repair(State& st, Budget& budget) {
  // Priced evaluations are bounded: in time mode by a fixed number (the cap
  // is only the search's guide; plans are judged by their step time), in bytes
  // mode by max(that, 4 per task); then the rest is moved unpriced, so that a
  // large grid (P = 1024: 700k-4M tasks; P = 4096) repairs in bounded time.
  const auto T = static_cast<std::int64_t>(st.model().tasks());
  const std::int64_t limit =
      st.time_mode() ? kTimeRepairEvaluations : std::max<std::int64_t>(kTimeRepairEvaluations, 4 * T);
  return repair_within(st, budget, limit, true);
}

bool repair_priced(State& st, Budget& budget, std::int64_t priced) {
  return repair_within(st, budget, std::min(priced, kTimeRepairEvaluations), false);
}

namespace {

// Best improving swap of t (on a) with a task on b, where b has no room for t
// alone. Partners are tasks on b that a already serves cheaply (their data is
// on a). Applies it and returns the partner when the pair improves the
// objective, else -1.
TaskId try_swap(State& st, TaskId t, Rank b, Budget& budget) {
  const Rank a = st.rank(t);
  const double d1 = st.delta(t, b);
  --budget.left;
  st.move(t, b);
  const TaskGrid& g = st.model().grid();
  TaskId best_t = -1;
  double best = -kEps - d1;
  for (TaskId u : st.tasks_on(b)) {
    if (u == t) continue;
    const std::int64_t Lu = st.model().load(u);
    if (st.load(b) - Lu > st.cap() || st.load(a) + Lu > st.cap()) continue;
    if (g.q_host(u) != a && g.k_host(u) != a && !st.holds_q(u, a) && !st.holds_kv(u, a)) continue;
    --budget.left;
    const double d2 = st.delta(u, a);
    if (d2 < best) {
      best = d2;
      best_t = u;
    }
    if (budget.spent()) break;
  }
  if (best_t < 0) {
    st.move(t, a);
    return -1;
  }
  st.move(best_t, a);
  return best_t;
}

}  // namespace

namespace {

// Tasks to (re)examine, each once until examined.
class Worklist {
 public:
  explicit Worklist(TaskId tasks) : queued_(static_cast<std::size_t>(tasks), 0) {}
  void push(TaskId t) {
    if (queued_[static_cast<std::size_t>(t)] != 0) return;
    queued_[static_cast<std::size_t>(t)] = 1;
    items_.push_back(t);
  }
  bool empty() const { return head_ == items_.size(); }
  TaskId pop() {
    const TaskId t = items_[head_++];
    queued_[static_cast<std::size_t>(t)] = 0;
    if (head_ == items_.size()) {
      items_.clear();
      head_ = 0;
    }
    return t;
  }

 private:
  std::vector<char> queued_;
  std::vector<TaskId> items_;
  std::size_t head_ = 0;
};

// After t moved off rank `from`: the tasks whose prices changed (same group,
// same q or kv block) and those that may now fit on `from` (its blocks' tasks).
void push_affected(const State& st, TaskId t, Rank from, Worklist& work) {
  const ByteModel& m = st.model();
  const int G = m.groups(), g = m.group_of(t);
  const Cell& c = m.grid().cell_of(t);
  for (RowKind d : {RowKind::qo, RowKind::kv})
    for (std::int32_t cell : m.cells_of(d, d == RowKind::qo ? c.qblock : c.kblock))
      work.push(static_cast<TaskId>(cell) * G + g);
  const auto& blocks = m.grid().sharding();
  for (int b = 0; b < blocks.num_blocks(); ++b) {
    if (blocks.host[static_cast<std::size_t>(b)] != from) continue;
    for (RowKind d : {RowKind::qo, RowKind::kv})
      for (std::int32_t cell : m.cells_of(d, b))
        for (int h = 0; h < G; ++h) work.push(static_cast<TaskId>(cell) * G + h);
  }
}

// Best improving relocation of t under the cap, else the best improving swap
// with a task on a rank that has no room for t. Returns the tasks moved.
int improve_task(State& st, TaskId t, Budget& budget, TaskId moved[2], Rank from[2]) {
  const Rank a = st.rank(t);
  const std::int64_t L = st.model().load(t);
  // Improving moves; among moves that keep the bytes, one to a rank that
  // ends lighter than a is now (it smooths the loads, which makes room for
  // later improving moves, and cannot cycle).
  Best best;
  std::int64_t best_load = 0;
  Rank blocked[64];
  int nblocked = 0;
  for_each_candidate(st, t, false, [&](Rank r) {
    if (r == a) return;
    if (st.load(r) + L > st.cap()) {
      if (nblocked < 64) blocked[nblocked++] = r;
      return;
    }
    --budget.left;
    const double d = st.delta(t, r);
    const bool acceptable = d < -kEps || (d <= kEps && st.load(r) + L < st.load(a));
    if (!acceptable) return;
    if (best.rank < 0 || d < best.value - kEps || (d <= best.value + kEps && st.load(r) < best_load)) {
      best = {d, r};
      best_load = st.load(r);
    }
  });
  if (best.rank >= 0) {
    st.move(t, best.rank);
    moved[0] = t;
    from[0] = a;
    return 1;
  }
  // Load-neutral: exchange the ranks of two head groups of t's cell. Their
  // (segment, group) counters are disjoint, so the two deltas add up exactly
  // (the bottleneck term aside, which is checked by applying).
  const ByteModel& m = st.model();
  const int G = m.groups();
  const TaskId base = t - m.group_of(t);
  TaskId best_u = -1;
  double best_swap = -kEps;
  for (int h = 0; h < G; ++h) {
    const TaskId u = base + h;
    const Rank b = st.rank(u);
    if (u == t || b == a) continue;
    budget.left -= 2;
    const double d = st.delta(t, b) + st.delta(u, a);
    if (d < best_swap) {
      best_swap = d;
      best_u = u;
    }
  }
  if (best_u >= 0) {
    const Rank b = st.rank(best_u);
    const double before = st.objective();
    st.move(t, b);
    st.move(best_u, a);
    if ((st.bottleneck_weight() == 0.0 && !st.time_mode()) || st.objective() < before - kEps) {
      moved[0] = t;
      from[0] = a;
      moved[1] = best_u;
      from[1] = b;
      return 2;
    }
    st.move(best_u, b);
    st.move(t, a);
  }
  for (int i = 0; i < nblocked && !budget.spent(); ++i) {
    const Rank r = blocked[i];
    const TaskId partner = try_swap(st, t, r, budget);
    if (partner >= 0) {
      moved[0] = t;
      from[0] = a;
      moved[1] = partner;
      from[1] = r;
      return 2;
    }
  }
  return 0;
}

void run(State& st, Budget& budget, Worklist& work) {
  TaskId moved[2];
  Rank from[2];
  while (!work.empty() && !budget.spent()) {
    const TaskId t = work.pop();
    const int n = improve_task(st, t, budget, moved, from);
    for (int i = 0; i < n; ++i) push_affected(st, moved[i], from[i], work);
  }
}

}  // namespace

void descend(State& st, Budget& budget) {
  Worklist work(st.model().tasks());
  for (TaskId t = 0; t < st.model().tasks(); ++t) work.push(t);
  run(st, budget, work);
}

void descend_after(State& st, Budget& budget, const std::vector<std::pair<TaskId, Rank>>& moves) {
  Worklist work(st.model().tasks());
  for (const auto& [t, from] : moves) push_affected(st, t, from, work);
  run(st, budget, work);
}

void iterate(State& st, Budget& budget, std::uint64_t seed) {
  // Bytes mode searches among placements that meet the cap; time mode judges
  // by the objective alone (the cap may be out of reach within its effort).
  const bool need_cap = !st.time_mode();
  if ((need_cap && st.excess() > 0) || st.ranks() < 2 || st.model().tasks() == 0) return;
  const ByteModel& m = st.model();
  const TaskId T = m.tasks();
  const int P = st.ranks(), G = m.groups();
  std::mt19937_64 rng(seed);
  auto below = [&](std::uint64_t n) { return static_cast<std::int64_t>(rng() % n); };
  double best = st.objective();
  st.checkpoint();
  std::vector<Rank> cands;
  while (!budget.spent()) {
    budget.left -= 4;  // a kick's price, also when it comes to nothing
    const auto t = static_cast<TaskId>(below(static_cast<std::uint64_t>(T)));
    const Rank a = st.rank(t);
    const auto kind = below(G > 1 ? 4 : 3);
    if (kind == 3) {
      // Exchange the ranks of two head groups of t's cell.
      const TaskId u = t - m.group_of(t) + static_cast<TaskId>(below(static_cast<std::uint64_t>(G)));
      const Rank b = st.rank(u);
      if (b == a) continue;
      st.move(t, b);
      st.move(u, a);
    } else {
      // Destination: a rank that already holds some of t's data, a host, or any.
      cands.clear();
      for_each_candidate(st, t, false, [&](Rank r) {
        if (r != a) cands.push_back(r);
      });
      const Rank b = !cands.empty() && below(4) != 0 ? cands[static_cast<std::size_t>(below(cands.size()))]
                                                     : static_cast<Rank>(below(static_cast<std::uint64_t>(P)));
      if (b == a) continue;
      if (kind == 0) {
        st.move(t, b);
      } else {
        // The tasks on a sharing t's q block (kind 1) or kv block (kind 2) and group.
        const RowKind d = kind == 1 ? RowKind::qo : RowKind::kv;
        const Cell& c = m.grid().cell_of(t);
        const int g = m.group_of(t);
        for (std::int32_t cell : m.cells_of(d, d == RowKind::qo ? c.qblock : c.kblock)) {
          const TaskId s = static_cast<TaskId>(cell) * G + g;
          if (st.rank(s) == a) st.move(s, b);
        }
      }
    }
    const bool ok = repair(st, budget);
    if (ok) descend_after(st, budget, st.journal());
    const double obj = st.objective();
    // Accept ties too: drifting on a plateau reaches other improvements.
    if ((!need_cap || (ok && st.excess() == 0)) && obj <= best + kEps) {
      best = std::min(best, obj);
      st.checkpoint();
    } else {
      st.rollback();
    }
  }
}

}  // namespace cpsched::search
