#pragma once
// Plan cache (the seed's "caching results for repeated mask patterns"): a
// repeated (mask, problem, solver, cost model, plan shape) costs a look-up
// instead of a solve and a plan build.
//
// The key is a canonical encoding of everything the result depends on: the
// mask slices, S, P, the sharding, heads (q, kv, dim, dtype bytes), grid
// options, the solver name and its resolved parameters, the cost model name
// and its resolved parameters, and the plan shape asked for. Look-ups hash it and
// compare it word for word, so a hash collision is a miss, never a wrong plan.
// Least recently used entries are evicted beyond the capacity. Thread safe.
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpsched/plan/shape.hpp"
#include "cpsched/plan/uses.hpp"
#include "cpsched/plan/solve_result.hpp"
#include "cpsched/plugin/params.hpp"

namespace cpsched {

struct PlanKey {
  std::vector<std::uint64_t> words;  // canonical encoding
  std::uint64_t hash = 0;
  friend bool operator==(const PlanKey& a, const PlanKey& b) { return a.hash == b.hash && a.words == b.words; }
};

PlanKey make_plan_key(const Problem& problem, const std::string& solver, const Params& solver_params,
                      const std::string& cost_model, const Params& cost_params, const PlanShape& shape,
                      const PlanUses& uses = {});
// The same key from the parts of a problem (no Problem needed for a look-up).
PlanKey make_plan_key(Token seqlen, const std::vector<Slice>& slices, const Heads& heads, const GridOptions& grid,
                      const Sharding& sharding, Layout layout, const std::string& solver, const Params& solver_params,
                      const std::string& cost_model, const Params& cost_params, const PlanShape& shape,
                      const PlanUses& uses = {});

class PlanCache {
 public:
  // capacity 0 disables caching (every find misses, insert stores nothing).
  explicit PlanCache(std::size_t capacity = 64) : capacity_(capacity) {}

  // The entry for `key` (now the most recently used), or null. Counts a hit or a miss.
  std::shared_ptr<const SolveResult> find(const PlanKey& key);
  // Stores (or replaces) the entry for `key`, evicting the least recently used.
  void insert(const PlanKey& key, std::shared_ptr<const SolveResult> value);
  void clear();

  std::size_t capacity() const { return capacity_; }
  std::size_t size() const;
  std::uint64_t hits() const;
  std::uint64_t misses() const;

 private:
  struct Entry {
    PlanKey key;
    std::shared_ptr<const SolveResult> value;
  };
  std::size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front = most recent
  std::unordered_map<std::uint64_t, std::list<Entry>::iterator> index_;  // by hash
  std::uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace cpsched
