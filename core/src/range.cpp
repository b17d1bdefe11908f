#include "cpsched/range.hpp"

#include <algorithm>

namespace cpsched {

namespace {
// Sorts and merges overlapping or adjacent ranges; drops empty ones.
std::vector<Range> normalize(std::vector<Range> v) {
  std::erase_if(v, [](Range r) { return r.empty(); });
  std::sort(v.begin(), v.end());
  std::vector<Range> out;
  out.reserve(v.size());
  for (Range r : v) {
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}
}  // namespace

RangeSet::RangeSet(std::initializer_list<Range> ranges)
    : ranges_(normalize(std::vector<Range>(ranges))) {}
RangeSet::RangeSet(std::vector<Range> ranges) : ranges_(normalize(std::move(ranges))) {}

RangeSet RangeSet::from_unsorted(std::vector<Range> ranges) { return RangeSet(std::move(ranges)); }

void RangeSet::add(Range r) {
  if (r.empty()) return;
  // Fast path: appending at the end (the common case when building in order).
  if (ranges_.empty() || r.begin > ranges_.back().end) {
    ranges_.push_back(r);
    return;
  }
  if (r.begin >= ranges_.back().begin) {
    ranges_.back().end = std::max(ranges_.back().end, r.end);
    return;
  }
  ranges_.push_back(r);
  ranges_ = normalize(std::move(ranges_));
}

Token RangeSet::size() const {
  Token n = 0;
  for (Range r : ranges_) n += r.size();
  return n;
}

bool RangeSet::contains(Token t) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), t,
                             [](Token v, Range r) { return v < r.begin; });
  return it != ranges_.begin() && std::prev(it)->contains(t);
}

RangeSet RangeSet::unite(const RangeSet& o) const {
  std::vector<Range> v = ranges_;
  v.insert(v.end(), o.ranges_.begin(), o.ranges_.end());
  return RangeSet(std::move(v));
}

RangeSet RangeSet::intersect(const RangeSet& o) const {
  RangeSet out;
  std::size_t i = 0, j = 0;
  while (i < ranges_.size() && j < o.ranges_.size()) {
    Range x = ranges_[i].intersect(o.ranges_[j]);
    if (!x.empty()) out.ranges_.push_back(x);
    if (ranges_[i].end < o.ranges_[j].end) ++i; else ++j;
  }
  return out;
}

RangeSet RangeSet::intersect(Range r) const { return intersect(RangeSet{r}); }

RangeSet RangeSet::subtract(const RangeSet& o) const {
  RangeSet out;
  std::size_t j = 0;
  for (Range r : ranges_) {
    Token cur = r.begin;
    while (j < o.ranges_.size() && o.ranges_[j].end <= cur) ++j;
    std::size_t k = j;
    while (k < o.ranges_.size() && o.ranges_[k].begin < r.end) {
      if (o.ranges_[k].begin > cur) out.ranges_.push_back({cur, o.ranges_[k].begin});
      cur = std::max(cur, o.ranges_[k].end);
      ++k;
    }
    if (cur < r.end) out.ranges_.push_back({cur, r.end});
  }
  return out;
}

Token RangeSet::local_offset(Token t) const {
  Token off = 0;
  for (Range r : ranges_) {
    if (r.contains(t)) return off + (t - r.begin);
    if (r.begin > t) break;
    off += r.size();
  }
  return -1;
}

std::vector<Range> RangeSet::to_local(Range q) const {
  std::vector<Range> out;
  Token off = 0;
  for (Range r : ranges_) {
    Range x = r.intersect(q);
    if (!x.empty()) out.push_back({off + (x.begin - r.begin), off + (x.end - r.begin)});
    off += r.size();
    if (r.begin >= q.end) break;
  }
  return out;
}

}  // namespace cpsched
