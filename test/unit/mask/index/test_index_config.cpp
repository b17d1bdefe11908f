// Index kinds in configs: .npy paths relative to the config's folder, the
// generators' keys, what make_problem builds, and located errors.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>


#include "cpsched/config/config.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/io/npy_array.hpp"
#include "cpsched/problem/problem.hpp"
#include "npy_files.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;
namespace fs = std::filesystem;

namespace {

fs::path dir() {
  static const fs::path d = [] {
    fs::path p = test::process_temp_dir("cpsched_index_config");
    fs::create_directories(p / "data");
    return p;
  }();
  return d;
}

void write_i4(const fs::path& p, const std::vector<std::int32_t>& v, const std::string& shape) {
  test::write_npy_i4(p, v, shape);
}

fs::path write_config(const std::string& name, const std::string& mask) {
  const fs::path p = dir() / name;
  std::ofstream(p) << "problem:\n  cp_size: 2\n  seqlen_per_rank: 4\n  heads: {q: 4, kv: 2, dim: 16}\n  mask: " << mask
                   << "\n";
  return p;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("config: topk from a .npy file next to the config") {
  if (!npy_supported()) return;
  // S = 8, one head, k = 2: each query its own token and token 0.
  std::vector<std::int32_t> v;
  for (int i = 0; i < 8; ++i) v.push_back(i), v.push_back(i == 0 ? -1 : 0);
  write_i4(dir() / "data" / "topk.npy", v, "(8, 1, 2)");
  const Config cfg = load_config(write_config("topk.yaml", "{kind: topk, indices: data/topk.npy, causal: true}"));
  CHECK(cfg.mask.kind == MaskKind::topk);
  CHECK(cfg.mask.indices_file == dir() / "data" / "topk.npy");
  const Problem p = make_problem(cfg);
  REQUIRE(p.index_mask != nullptr);
  CHECK(p.index_mask->area() == 15);
  CHECK(p.seqlen() == 8);
  CHECK(p.mask.slices().empty());

  // A shape that does not match S: at the key, saying where S comes from.
  write_i4(dir() / "data" / "short.npy", std::vector<std::int32_t>(8, 0), "(4, 1, 2)");
  const fs::path bad = write_config("short.yaml", "{kind: topk, indices: data/short.npy}");
  const std::string e = error_of([&] { load_config(bad); });
  CHECK(contains(e, bad.string() + ":5:31: problem.mask.indices: " + (dir() / "data" / "short.npy").string() +
                        ": shape [4, 1, 2] does not match S = 8 (expected [8, H_kv, k]) (S = cp_size x seqlen_per_rank = "
                        "2 x 4)"));
  const fs::path missing = write_config("missing.yaml", "{kind: topk, indices: nothere.npy}");
  CHECK(contains(error_of([&] { load_config(missing); }), (dir() / "nothere.npy").string() + ": no such file"));
}

TEST_CASE("config: dsa and nsa generators, block kinds, kv_heads") {
  if (!npy_supported()) return;
  Config cfg = load_config(write_config("dsa.yaml", "{kind: dsa, topk: 4, sink: 1, local: 2, lengths: [5, 3], seed: 3}"));
  CHECK(cfg.mask.topk == 4);
  CHECK(cfg.mask.sink == 1);
  CHECK(cfg.mask.local == 2);
  Problem p = make_problem(cfg);
  REQUIRE(p.index_mask != nullptr);
  CHECK(p.index_mask->indices.shape == std::vector<std::int64_t>{8, 1, 4});

  cfg = load_config(write_config("nsa.yaml", "{kind: nsa, nsa_block: 2, nsa_top: 3, kv_heads: 2}"));
  p = make_problem(cfg);
  CHECK(p.index_mask == nullptr);
  CHECK(p.head_masks.size() == 2);

  write_i4(dir() / "bt.npy", {0, -1, 0, -1, 0, 1, 0, 1}, "(1, 4, 2)");
  cfg = load_config(write_config("bt.yaml", "{kind: block_topk, indices: bt.npy, block_size: [2, 4]}"));
  CHECK(cfg.mask.block_q == 2);
  CHECK(cfg.mask.block_k == 4);
  p = make_problem(cfg);
  CHECK(p.head_masks.empty());
  CHECK(p.mask.area() == 10 + 16 + 10);

  write_i4(dir() / "indptr.npy", {0, 1, 3}, "(3,)");
  write_i4(dir() / "indices.npy", {0, 0, 1}, "(3,)");
  cfg = load_config(write_config("bsr.yaml", "{kind: bsr, indptr: indptr.npy, indices: indices.npy, block_size: 4}"));
  p = make_problem(cfg);
  CHECK(p.mask.area() == 10 + 16 + 10);

  CHECK(contains(error_of([&] { load_config(write_config("kv.yaml", "{kind: dsa, kv_heads: 3}")); }),
                 "problem.mask.kv_heads: kv_heads = 3: a selection is shared by every head (1) or per KV head "
                 "(heads.kv = 2)"));
  CHECK(contains(error_of([&] { load_config(write_config("bsr2.yaml", "{kind: bsr, indices: indices.npy}")); }),
                 "problem.mask: kind 'bsr' needs the key 'indptr' (a .npy file)"));
  CHECK(contains(error_of([&] { load_config(write_config("bs.yaml", "{kind: block_topk, indices: bt.npy, block_size: [2]}")); }),
                 "problem.mask.block_size: expected [block_q, block_k] (query and key block sizes in tokens), got"));
  CHECK(contains(error_of([&] { load_config(write_config("k0.yaml", "{kind: dsa, topk: 0}")); }), "problem.mask.topk"));
}

TEST_CASE("config: an empty selection is an error naming the file (it planned 0 tasks and PASSED)") {
  // S = 8: shape [8, 1, 0], and [8, 1, 2] all -1.
  write_i4(dir() / "k0.npy", {}, "(8, 1, 0)");
  const fs::path c0 = write_config("k0.yaml", "{kind: topk, indices: k0.npy}");
  const std::string e0 = error_of([&] { load_config(c0); });
  CHECK(contains(e0, (dir() / "k0.npy").string() + ": the topk selection (shape [8, 1, 0]) selects no (query, key) pair: "
                                                  "nothing to plan"));
  write_i4(dir() / "neg.npy", std::vector<std::int32_t>(16, -1), "(8, 1, 2)");
  const fs::path c1 = write_config("neg.yaml", "{kind: topk, indices: neg.npy}");
  CHECK(contains(error_of([&] { load_config(c1); }), "neg.npy: the topk selection (shape [8, 1, 2]) selects no"));
  // A BSR with no block.
  write_i4(dir() / "ptr0.npy", std::vector<std::int32_t>(3, 0), "(3,)");
  write_i4(dir() / "idx0.npy", {}, "(0,)");
  const fs::path c2 = write_config("bsr0.yaml", "{kind: bsr, block_size: 4, indptr: ptr0.npy, indices: idx0.npy}");
  CHECK(contains(error_of([&] { load_config(c2); }), "selects no (query, key) pair"));
  // The same from C++: a range mask without slices, or with empty ones.
  CHECK(contains(error_of([] { (void)Problem::make(RangeMask(16, {}), 2, Heads{4, 2, 16, 2}); }),
                 "mask: no slice: the mask selects no (query, key) pair, nothing to plan"));
}

TEST_CASE("config: a head-count mismatch names the file and says what fits") {
  // The message was "a selection is shared by all heads (1) or per KV head (1)", no file named.
  std::vector<std::int32_t> v(8 * 2 * 1, -1);
  for (int i = 0; i < 8; ++i) v[static_cast<std::size_t>(i * 2)] = i;
  write_i4(dir() / "two.npy", v, "(8, 2, 1)");
  const fs::path p = dir() / "two_heads.yaml";
  std::ofstream(p) << "problem:\n  cp_size: 2\n  seqlen_per_rank: 4\n  heads: {q: 4, kv: 1, dim: 16}\n"
                      "  mask: {kind: topk, indices: two.npy}\n";
  const std::string e = error_of([&] { load_config(p); });
  CHECK(contains(e, (dir() / "two.npy").string() + ": the index mask (shape [8, 2, 1]) selects for 2 KV heads but "
                                                 "heads.kv = 1: with one KV head the selection has one head"));
  CHECK(!contains(e, "(1) or"));
}
