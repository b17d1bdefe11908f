// Fuzz target: index masks, from memory and from configs.
//
// Even first byte: an index mask built from the bytes (kind topk, block_topk
// or bsr; S <= 256, P <= 8, 1-3 blocks per rank, a selection shared by all
// heads or one per KV head, entries anywhere in [-2, S + 1], so bad ones
// too). It must validate or throw cpsched::Error. A valid one is planned
// with every task on its q block's host and checked end to end: the
// up-front estimate (resources.hpp) counts the grid's selected pairs and
// cells exactly and bounds the plan's index pools; the plan validates
// (the chunked pair check, with chunks of 1 to 64 pairs, so many chunks).
//
// Odd first byte: a config of a synthetic index kind (dsa or nsa) or a topk
// / block_topk / bsr kind reading .npy files written from the bytes, with
// topk, nsa_top, nsa_block, sink, local, kv_heads, block_size and the sizes
// taken from the bytes (huge values included: they must be clamped or
// refused, never allocated). parse_config + make_problem must succeed or
// throw cpsched::Error.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/resources.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/mask/index/index_mask.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "fuzz_input.hpp"

using namespace cpsched;

namespace {

const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path d = [] {
    auto p = std::filesystem::temp_directory_path() / ("cpsched_fuzz_index_" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p;
  }();
  return d;
}

void write_npy(const std::filesystem::path& p, const std::vector<std::int32_t>& v, const std::vector<std::int64_t>& shape) {
  std::string dims;
  for (std::int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (f == nullptr) return;
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(dict.size() & 0xff),
                                 static_cast<unsigned char>(dict.size() >> 8)};
  std::fwrite(pre, 1, 10, f);
  std::fwrite(dict.data(), 1, dict.size(), f);
  if (!v.empty()) std::fwrite(v.data(), 4, v.size(), f);
  std::fclose(f);
}

std::vector<std::int32_t> entries(fuzz::Bytes& in, std::size_t n, std::int64_t hi) {
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = static_cast<std::int32_t>(in.range(-2, hi + 1));
  return v;
}

// An index mask from the bytes (its arrays owned by it).
IndexMask memory_mask(fuzz::Bytes& in, int hkv) {
  IndexMask m;
  m.kind = static_cast<IndexMaskKind>(in.range(0, 2));
  m.seqlen = in.range(1, 256);
  m.causal = in.range(0, 1) == 1;
  m.kv_heads = in.range(0, 1) == 1 ? hkv : 1;
  const std::int64_t S = m.seqlen, H = m.kv_heads;
  auto own = [](std::vector<std::int32_t> v, std::vector<std::int64_t> shape, const char* name) {
    return IndexArray::own(std::make_shared<const std::vector<std::int32_t>>(std::move(v)), std::move(shape), name);
  };
  if (m.kind == IndexMaskKind::topk) {
    const std::int64_t k = in.range(0, 8);
    m.indices = own(entries(in, static_cast<std::size_t>(S * H * k), S), {S, H, k}, "<indices>");
    return m;
  }
  m.block_q = static_cast<int>(in.range(1, 16));
  m.block_k = static_cast<int>(in.range(1, 16));
  const std::int64_t nqb = m.num_query_blocks(), nkb = (S + m.block_k - 1) / m.block_k;
  if (m.kind == IndexMaskKind::block_topk) {
    const std::int64_t n = in.range(0, 6);
    m.indices = own(entries(in, static_cast<std::size_t>(H * nqb * n), nkb), {H, nqb, n}, "<indices>");
    return m;
  }
  // bsr: per head an indptr row of non-decreasing offsets (sometimes broken).
  std::vector<std::int32_t> indptr;
  std::int64_t nnz = 0;
  for (std::int64_t h = 0; h < H; ++h) {
    std::int32_t at = 0;
    indptr.push_back(at);
    for (std::int64_t qb = 0; qb < nqb; ++qb) {
      at += static_cast<std::int32_t>(in.range(in.range(0, 15) == 0 ? -1 : 0, 3));
      indptr.push_back(at);
    }
    nnz += std::max<std::int32_t>(0, at);
  }
  m.indptr = own(std::move(indptr), {H, nqb + 1}, "<indptr>");
  m.indices = own(entries(in, static_cast<std::size_t>(nnz), nkb), {nnz}, "<indices>");
  return m;
}

void memory_case(fuzz::Bytes& in) {
  const int P = static_cast<int>(in.range(1, 8));
  Heads heads{8, static_cast<int>(1 << in.range(0, 2)), 16, 2};  // kv 1, 2 or 4
  GridOptions grid{true, static_cast<int>(in.range(1, 3))};
  const auto mask = std::make_shared<const IndexMask>(memory_mask(in, heads.kv));
  const std::size_t chunk = static_cast<std::size_t>(in.range(1, 64));
  std::shared_ptr<const Problem> p;
  try {
    p = std::make_shared<const Problem>(Problem::make(mask, P, heads, grid));
  } catch (const Error&) {
    return;  // an invalid selection, an empty one, S below the blocks: refused with a message
  }
  const ResourceEstimate e = estimate_resources(*p);
  const auto g = std::make_shared<const TaskGrid>(p);
  // The estimate counts what the grid holds.
  if (p->index_mask) {
    if (static_cast<Token>(e.selected_pairs) * g->num_groups() / (g->per_group_cells() ? g->num_groups() : 1) !=
        g->total_task_area())
      fuzz::broken();
    std::int64_t cells = 0;  // non-empty (head, block pair) cells
    for (TaskId t = 0; t < g->num_tasks(); ++t) cells += g->area(t) > 0 ? 1 : 0;
    if (!g->per_group_cells()) cells /= g->num_groups();
    if (cells != e.touches || g->task_count() > e.tasks) fuzz::broken();
  } else if (g->task_count() > e.tasks) {
    fuzz::broken();
  }
  Assignment a;
  a.grid = g;
  a.rank.resize(static_cast<std::size_t>(g->num_tasks()));
  for (TaskId t = 0; t < g->num_tasks(); ++t) a.rank[static_cast<std::size_t>(t)] = g->q_host(t);
  const Plan plan = build_plan(a, PlanOptions{static_cast<int>(in.range(1, 3)), 0});
  if (p->index_mask) {
    std::int64_t pool = 0;
    for (const RankPlan& r : plan.ranks) pool += static_cast<std::int64_t>(r.fwd.calc.indices.size());
    if (pool > e.index_pool) fuzz::broken();  // the estimate bounds the pools
  }
  ValidateOptions vo;
  vo.index_chunk_pairs = chunk;
  if (!validate_plan(a, plan, vo).empty()) fuzz::broken();
}

void config_case(fuzz::Bytes& in) {
  static const char* kinds[] = {"dsa", "nsa", "topk", "block_topk", "bsr"};
  const char* kind = kinds[in.range(0, 4)];
  const int P = static_cast<int>(in.range(1, 8));
  const std::int64_t per_rank = in.range(1, 64);
  const std::int64_t S = P * per_rank;
  const int hkv = static_cast<int>(1 << in.range(0, 2));
  // Sizes from small to absurd: clamped (topk, nsa_top) or refused, never allocated.
  auto wide = [&] { return in.range(0, 1) ? in.range(0, 4 * S + 4) : in.range(0, std::int64_t{1} << 40); };
  std::string mask = fmt::format("{{kind: {}", kind);
  const std::string kvh = in.range(0, 1) ? fmt::format(", kv_heads: {}", in.range(0, 1) ? hkv : in.range(0, 9)) : "";
  if (std::string(kind) == "dsa") {
    mask += fmt::format(", topk: {}, sink: {}, local: {}, seed: {}{}", wide(), in.range(0, 2 * S), in.range(0, 2 * S),
                        in.range(0, 1000), kvh);
  } else if (std::string(kind) == "nsa") {
    mask += fmt::format(", nsa_block: {}, nsa_top: {}, nsa_initial: {}, nsa_local: {}{}", in.range(1, 2 * S + 2),
                        wide(), in.range(0, 8), in.range(0, 8), kvh);
  } else {
    const auto dir = scratch_dir();
    const std::int64_t H = in.range(0, 1) ? hkv : 1;
    if (std::string(kind) == "topk") {
      const std::int64_t k = in.range(0, 6);
      write_npy(dir / "i.npy", entries(in, static_cast<std::size_t>(S * H * k), S), {S, H, k});
      mask += ", indices: i.npy";
    } else {
      const std::int64_t bq = in.range(1, 8), bk = in.range(1, 8), nqb = (S + bq - 1) / bq, nkb = (S + bk - 1) / bk;
      mask += fmt::format(", block_size: [{}, {}], indices: i.npy", bq, bk);
      if (std::string(kind) == "block_topk") {
        const std::int64_t n = in.range(0, 4);
        write_npy(dir / "i.npy", entries(in, static_cast<std::size_t>(H * nqb * n), nkb), {H, nqb, n});
      } else {
        std::vector<std::int32_t> indptr;
        std::int32_t at = 0;
        for (std::int64_t h = 0; h < H; ++h) {
          at = 0;
          indptr.push_back(0);
          for (std::int64_t qb = 0; qb < nqb; ++qb) indptr.push_back(at += static_cast<std::int32_t>(in.range(0, 2)));
        }
        std::int64_t nnz = 0;
        for (std::int64_t h = 0; h < H; ++h) nnz += indptr[static_cast<std::size_t>(h * (nqb + 1) + nqb)];
        write_npy(dir / "p.npy", indptr, {H, nqb + 1});
        write_npy(dir / "i.npy", entries(in, static_cast<std::size_t>(nnz), nkb), {nnz});
        mask += ", indptr: p.npy";
      }
    }
    mask += in.range(0, 1) ? ", causal: true" : ", causal: false";
    mask += kvh;
  }
  mask += "}";
  const std::string yaml = fmt::format(
      "problem:\n  cp_size: {}\n  seqlen_per_rank: {}\n  heads: {{q: 8, kv: {}, dim: 16}}\n"
      "  grid: {{blocks_per_rank: {}}}\n  mask: {}\nmemory_budget: 256M\n",
      P, per_rank, hkv, in.range(1, 3), mask);
  try {
    const Config cfg = parse_config(yaml, (scratch_dir() / "fuzz.yaml").string(), {});
    const Problem p = make_problem(cfg);
    const ResourceEstimate e = estimate_resources(p);
    if (e.total_bytes(false, true) < 0) fuzz::broken();
  } catch (const Error&) {
    // refused with a located message
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Bytes in(data, size);
  if (in.u8() % 2 == 0) memory_case(in);
  else config_case(in);
  return 0;
}
