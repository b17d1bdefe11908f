#include "cpsched/base/range.hpp"

#include <algorithm>

namespace cpsched {

namespace {
// Merges overlapping or adjacent ranges of v, sorted by begin and without
// empty ones, in place.
void merge_sorted(std::vector<Range>& v) {
  std::size_t n = 0;
  for (Range r : v) {
    if (n > 0 && r.begin <= v[n - 1].end) {
      v[n - 1].end = std::max(v[n - 1].end, r.end);
    } else {
      v[n++] = r;
    }
  }
  v.resize(n);
}

// Sorts and merges overlapping or adjacent ranges; drops empty ones.
std::vector<Range> normalize(std::vector<Range> v) {
  std::erase_if(v, [](Range r) { return r.empty(); });
  if (!std::is_sorted(v.begin(), v.end(), [](Range a, Range b) { return a.begin < b.begin; }))
    std::sort(v.begin(), v.end());
  merge_sorted(v);
  return v;
}
}  // namespace

RangeSet RangeSet::Builder::build() {
  if (!sorted_) std::sort(ranges_.begin(), ranges_.end());
  merge_sorted(ranges_);
  RangeSet out;
  out.ranges_ = std::move(ranges_);
  ranges_ = {};
  sorted_ = true;
  return out;
}

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
  // First range ending at or after r.begin: r merges with it and the ones
  // after it that begin at or before r.end.
  auto first = std::lower_bound(ranges_.begin(), ranges_.end(), r.begin, [](Range x, Token v) { return x.end < v; });
  auto last = first;
  while (last != ranges_.end() && last->begin <= r.end) ++last;
  if (first == last) {
    ranges_.insert(first, r);
    return;
  }
  first->begin = std::min(first->begin, r.begin);
  first->end = std::max(std::prev(last)->end, r.end);
  ranges_.erase(std::next(first), last);
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
