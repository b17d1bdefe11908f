#include "mask_ingest.hpp"

#include <algorithm>
#include <map>
#include <utility>

namespace cpsched::gpu {

std::vector<IngestedCell> cells_from_records(const std::vector<CellRecord>& records) {
  std::map<std::pair<int, int>, std::pair<Token, std::pair<std::vector<Range>, std::vector<Range>>>> acc;
  for (const CellRecord& r : records) {
    if (r.area <= 0) continue;
    auto& c = acc[{r.qblock, r.kblock}];
    c.first += r.area;
    c.second.first.push_back({r.rows.b, r.rows.e});
    c.second.second.push_back({r.cols.b, r.cols.e});
  }
  std::vector<IngestedCell> out;
  out.reserve(acc.size());
  for (auto& [key, v] : acc)
    out.push_back({key.first, key.second, v.first, RangeSet::from_unsorted(std::move(v.second.first)),
                   RangeSet::from_unsorted(std::move(v.second.second))});
  return out;
}

std::vector<DevSlice> to_dev_slices(const std::vector<Slice>& slices) {
  std::vector<DevSlice> out;
  out.reserve(slices.size());
  for (const Slice& s : slices)
    out.push_back({s.q.begin, s.q.end, s.k.begin, s.k.end, static_cast<std::int32_t>(s.type), 0});
  return out;
}

std::vector<i64> block_bounds(const Sharding& sh) {
  std::vector<i64> b;
  b.reserve(sh.blocks.size() + 1);
  for (const Range& r : sh.blocks) b.push_back(r.begin);
  b.push_back(sh.blocks.empty() ? 0 : sh.blocks.back().end);
  return b;
}

}  // namespace cpsched::gpu
