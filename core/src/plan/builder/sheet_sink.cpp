// The splits of a price sheet (builder_internal.hpp: SheetSink).
#include <algorithm>

#include "plan/builder/internal.hpp"

namespace cpsched::plan_detail {

namespace {

std::uint64_t mix(std::uint64_t k) {  // splitmix64's finaliser: keys of one sender's splits are adjacent
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ULL;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebULL;
  return k ^ (k >> 31);
}

}  // namespace

SheetSink::SheetSink(int ranks, int stages, bool keep_layout)
    : P_(ranks), N_(stages), keep_layout_(keep_layout), table_(1024, 0) {}

std::size_t SheetSink::slot_of(std::uint64_t key) const {
  const std::size_t mask = table_.size() - 1;
  std::size_t i = mix(key) & mask;
  while (table_[i] != 0 && entries_[static_cast<std::size_t>(table_[i] - 1)].key != key) i = (i + 1) & mask;
  return i;
}

void SheetSink::grow() {
  table_.assign(2 * table_.size(), 0);
  for (std::size_t e = 0; e < entries_.size(); ++e) table_[slot_of(entries_[e].key)] = static_cast<std::int32_t>(e + 1);
}

void SheetSink::add(int phase, RowKind kind, int stage, Rank src, Rank dst, Token tokens) {
  const auto P = static_cast<std::uint64_t>(P_);
  const std::uint64_t key =
      ((((static_cast<std::uint64_t>(phase) * 2 + static_cast<std::uint64_t>(index_of(kind))) *
             static_cast<std::uint64_t>(N_) + static_cast<std::uint64_t>(stage - 1)) * P + static_cast<std::uint64_t>(src)) *
       P) + static_cast<std::uint64_t>(dst);
  const std::size_t i = slot_of(key);
  if (table_[i] != 0) {
    entries_[static_cast<std::size_t>(table_[i] - 1)].tokens += tokens;
    return;
  }
  entries_.push_back({key, tokens});
  table_[i] = static_cast<std::int32_t>(entries_.size());
  if (2 * entries_.size() > table_.size()) grow();
}

void SheetSink::finish(PriceSheet::Pass& out) const {
  const auto P = static_cast<std::uint64_t>(P_);
  const auto N = static_cast<std::uint64_t>(N_);
  const std::size_t parts = static_cast<std::size_t>(P * N * 4);
  struct Where {
    std::size_t send, recv;  // part indices (PriceSheet::part)
    Rank src, dst;
  };
  auto where = [&](std::uint64_t key) {
    const auto dst = static_cast<Rank>(key % P);
    key /= P;
    const auto src = static_cast<Rank>(key % P);
    key /= P;
    const auto stage = static_cast<int>(key % N) + 1;
    key /= N;
    const auto kind = static_cast<int>(key % 2), phase = static_cast<int>(key / 2);
    return Where{PriceSheet::part_of(N_, src, stage, kind, phase), PriceSheet::part_of(N_, dst, stage, kind, phase),
                 src, dst};
  };
  // A stable counting sort by part on each side keeps the first-added order.
  out.send_begin.assign(parts + 1, 0);
  out.recv_begin.assign(parts + 1, 0);
  out.has_forwarding = false;
  for (const Entry& e : entries_) {
    const Where w = where(e.key);
    ++out.send_begin[w.send + 1];
    ++out.recv_begin[w.recv + 1];
    out.has_forwarding = out.has_forwarding || (w.send & 1) != 0;
  }
  for (std::size_t i = 0; i < parts; ++i) {
    out.send_begin[i + 1] += out.send_begin[i];
    out.recv_begin[i + 1] += out.recv_begin[i];
  }
  out.send.resize(entries_.size());
  out.recv.resize(entries_.size());
  std::vector<std::int32_t> fs(out.send_begin.begin(), out.send_begin.end() - 1);
  std::vector<std::int32_t> fr(out.recv_begin.begin(), out.recv_begin.end() - 1);
  for (const Entry& e : entries_) {
    const Where w = where(e.key);
    out.send[static_cast<std::size_t>(fs[w.send]++)] = {e.tokens, w.dst};
    out.recv[static_cast<std::size_t>(fr[w.recv]++)] = {e.tokens, w.src};
  }
}

}  // namespace cpsched::plan_detail
