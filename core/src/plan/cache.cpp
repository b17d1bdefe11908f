#include "cpsched/plan/cache.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <variant>

namespace cpsched {

namespace {

// Canonical words of a key; strings are length-prefixed so that no two
// different inputs encode the same.
class Encoder {
 public:
  void reserve(std::size_t n) { w_.reserve(n); }
  void word(std::uint64_t v) { w_.push_back(v); }
  void i64(std::int64_t v) { word(static_cast<std::uint64_t>(v)); }
  void str(const std::string& s) {
    word(s.size());
    for (std::size_t i = 0; i < s.size(); i += 8) {
      std::uint64_t v = 0;
      std::memcpy(&v, s.data() + i, std::min<std::size_t>(8, s.size() - i));
      word(v);
    }
  }
  void params(const Params& p) {
    word(p.values().size());
    for (const auto& [name, value] : p.values()) {
      str(name);
      word(value.index());
      std::visit(
          [&](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, std::string>) str(v);
            else if constexpr (std::is_same_v<T, double>) {
              std::uint64_t bits = 0;
              std::memcpy(&bits, &v, sizeof bits);
              word(bits);
            } else i64(static_cast<std::int64_t>(v));
          },
          value);
    }
  }
  std::vector<std::uint64_t> take() { return std::move(w_); }

 private:
  std::vector<std::uint64_t> w_;
};

// 64-bit mix per word (splitmix64 finaliser over a running state).
std::uint64_t hash_words(const std::vector<std::uint64_t>& w) {
  std::uint64_t h = 0x9e3779b97f4a7c15ULL ^ w.size();
  for (std::uint64_t v : w) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ULL;
  }
  h ^= h >> 29;
  return h;
}

}  // namespace

PlanKey make_plan_key(const Problem& p, const std::string& solver, const Params& solver_params,
                      const std::string& cost_model, const Params& cost_params, const PlanShape& shape,
                      const PlanUses& uses) {
  return make_plan_key(p.seqlen(), p.mask.slices(), p.heads, p.grid, p.sharding, p.layout, solver, solver_params, cost_model,
                       cost_params, shape, uses);
}

PlanKey make_plan_key(Token seqlen, const std::vector<Slice>& slices, const Heads& heads, const GridOptions& grid,
                      const Sharding& sharding, Layout layout, const std::string& solver, const Params& solver_params,
                      const std::string& cost_model, const Params& cost_params, const PlanShape& shape,
                      const PlanUses& uses) {
  Encoder e;
  e.reserve(32 + 3 * sharding.blocks.size() + 5 * slices.size() + 4 * (solver_params.values().size() + cost_params.values().size()));
  e.word(0x63707363686565ULL);  // format tag, bumped if the encoding changes
  e.i64(seqlen);
  e.i64(heads.q);
  e.i64(heads.kv);
  e.i64(heads.dim);
  e.i64(heads.dtype_bytes);
  // MLA geometry only when it differs from GQA, so GQA keys stay as they were.
  if (!heads.is_gqa()) {
    e.word(0x6d6c61ULL);  // "mla"
    e.i64(heads.dv());
    e.i64(heads.kv_shared ? 1 : 0);
  }
  e.i64(grid.flatten_head_groups ? 1 : 0);
  e.i64(grid.blocks_per_rank);
  e.i64(sharding.cp_size);
  e.i64(static_cast<std::int64_t>(layout));
  e.word(sharding.blocks.size());
  for (std::size_t b = 0; b < sharding.blocks.size(); ++b) {
    e.i64(sharding.blocks[b].begin);
    e.i64(sharding.blocks[b].end);
    e.i64(sharding.host[b]);
  }
  e.word(slices.size());
  for (const Slice& s : slices) {
    e.i64(s.q.begin);
    e.i64(s.q.end);
    e.i64(s.k.begin);
    e.i64(s.k.end);
    e.i64(static_cast<std::int64_t>(s.type));
  }
  e.str(solver);
  e.params(solver_params);
  e.str(cost_model);
  e.params(cost_params);
  e.i64(shape.stages);
  e.i64(static_cast<std::int64_t>(shape.relay));
  e.i64(shape.node_size);
  e.i64(static_cast<std::int64_t>(shape.cut));
  e.i64(uses.uses);
  PlanKey k;
  k.words = e.take();
  k.hash = hash_words(k.words);
  return k;
}

std::shared_ptr<const SolveResult> PlanCache::find(const PlanKey& key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key.hash);
  if (it == index_.end() || !(it->second->key == key)) {
    ++misses_;
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  ++hits_;
  return it->second->value;
}

void PlanCache::insert(const PlanKey& key, std::shared_ptr<const SolveResult> value) {
  if (capacity_ == 0) return;
  std::lock_guard lock(mu_);
  auto it = index_.find(key.hash);
  if (it != index_.end()) {
    // Same key: replace. A colliding key takes the slot (the old one is evicted).
    it->second->key = key;
    it->second->value = std::move(value);
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(Entry{key, std::move(value)});
  index_[key.hash] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().key.hash);
    lru_.pop_back();
  }
}

void PlanCache::clear() {
  std::lock_guard lock(mu_);
  lru_.clear();
  index_.clear();
}

std::size_t PlanCache::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

std::uint64_t PlanCache::hits() const {
  std::lock_guard lock(mu_);
  return hits_;
}

std::uint64_t PlanCache::misses() const {
  std::lock_guard lock(mu_);
  return misses_;
}

}  // namespace cpsched
