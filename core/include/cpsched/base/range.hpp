#pragma once
// Half-open token ranges [begin, end) and sorted, merged sets of them.
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace cpsched {

using Token = std::int64_t;

struct Range {
  Token begin = 0;
  Token end = 0;

  constexpr Token size() const { return end > begin ? end - begin : 0; }
  constexpr bool empty() const { return end <= begin; }
  constexpr bool contains(Token t) const { return t >= begin && t < end; }
  constexpr Range intersect(Range o) const {
    Range r{begin > o.begin ? begin : o.begin, end < o.end ? end : o.end};
    return r.empty() ? Range{} : r;
  }
  // The smallest range covering both; an empty range adds nothing.
  constexpr Range hull(Range o) const {
    if (o.empty()) return *this;
    if (empty()) return o;
    return {begin < o.begin ? begin : o.begin, end > o.end ? end : o.end};
  }
  friend constexpr bool operator==(Range, Range) = default;
  friend constexpr auto operator<=>(Range, Range) = default;
};

// A set of tokens stored as sorted, disjoint, non-adjacent ranges.
class RangeSet {
 public:
  RangeSet() = default;
  RangeSet(std::initializer_list<Range> ranges);
  explicit RangeSet(std::vector<Range> ranges);  // any order, overlaps allowed

  void add(Range r);                // O(log n) search + O(n) shift; use Builder in loops
  static RangeSet from_unsorted(std::vector<Range> ranges);

  // Collects ranges in any order and merges them once: O(n) when they come
  // sorted by begin, O(n log n) otherwise (n = ranges added), where n add()
  // calls in a loop can cost O(n^2).
  class Builder {
   public:
    void reserve(std::size_t n) { ranges_.reserve(n); }
    void add(Range r) {
      if (r.empty()) return;
      if (!ranges_.empty() && r.begin < ranges_.back().begin) sorted_ = false;
      ranges_.push_back(r);
    }
    void add(const RangeSet& s) {
      for (Range r : s.ranges()) add(r);
    }
    bool empty() const { return ranges_.empty(); }
    std::size_t pending() const { return ranges_.size(); }
    // The merged set; the builder is left empty, ready for reuse.
    RangeSet build();

   private:
    std::vector<Range> ranges_;
    bool sorted_ = true;
  };

  const std::vector<Range>& ranges() const { return ranges_; }
  bool empty() const { return ranges_.empty(); }
  Token size() const;  // number of tokens
  bool contains(Token t) const;

  RangeSet unite(const RangeSet& o) const;
  RangeSet intersect(const RangeSet& o) const;
  RangeSet intersect(Range r) const;
  RangeSet subtract(const RangeSet& o) const;

  // Position of global token t inside the concatenation of this set's ranges
  // (the "local buffer offset"); -1 when t is not in the set.
  Token local_offset(Token t) const;
  // The pieces of global range r, each mapped to local (buffer) coordinates.
  // r must lie inside the set.
  std::vector<Range> to_local(Range r) const;

  friend bool operator==(const RangeSet&, const RangeSet&) = default;

 private:
  std::vector<Range> ranges_;
};

}  // namespace cpsched
