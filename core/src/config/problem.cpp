// The `problem:` section (docs/design.md#configuration): cp_size, seqlen_per_rank, heads, grid
// and mask. Each value is checked where it is read, so that its error points
// at it; checks that tie values together run once the values are known.
#include "config/problem.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/base/limits.hpp"
#include "cpsched/problem/resources.hpp"
#include "problem/index_problem.hpp"

namespace cpsched::config_detail {

namespace {

// Bounds of the single values; limits.hpp bounds what they make together.
constexpr std::int64_t kMaxRanks = limits::kMaxRanks;
constexpr std::int64_t kMaxTokensPerRank = std::int64_t{1} << 36;

struct DType {
  const char* name;
  int bytes;
};
constexpr DType kDTypes[] = {{"bf16", 2}, {"fp16", 2}, {"fp32", 4}, {"fp8", 1}};

bool uses_documents(MaskKind k) {
  return k != MaskKind::full && k != MaskKind::causal && k != MaskKind::slices && k != MaskKind::topk &&
         k != MaskKind::block_topk && k != MaskKind::bsr;
}

void read_heads(const Section& s, Heads& heads) {
  const bool q_ok = s.read_int("q", heads.q, 1);
  const bool kv_ok = s.read_int("kv", heads.kv, 1);
  // d_qk: `dim` (GQA's D) or `dim_qk` (MLA's name); both only when they agree.
  int dim = heads.dim, dim_qk = heads.dim;
  const bool dim_ok = s.read_int("dim", dim, 1);
  const bool dim_qk_ok = s.read_int("dim_qk", dim_qk, 1);
  if (dim_ok && dim_qk_ok && dim != dim_qk)
    s.error("dim_qk", "dim_qk = " + std::to_string(dim_qk) + " differs from dim = " + std::to_string(dim) +
                          "; both name d_qk (Q and K head dim): give one of them");
  else if (dim_qk_ok) heads.dim = dim_qk;
  else if (dim_ok) heads.dim = dim;
  const bool dim_v_ok = s.read_int("dim_v", heads.dim_v, 0);
  const bool shared_ok = s.read_bool("kv_shared", heads.kv_shared);
  // A shared latent row holds K (d_qk dims) and V is its first d_v dims.
  const bool dims_ok = (dim_ok || !s.has("dim")) && (dim_qk_ok || !s.has("dim_qk")) && (dim_v_ok || !s.has("dim_v"));
  if (dims_ok && (shared_ok || !s.has("kv_shared")) && heads.kv_shared && heads.dv() > heads.dim)
    s.error(s.has("dim_v") ? "dim_v" : "kv_shared",
            "kv_shared: V is the first dim_v dims of the latent K row, so dim_v = " + std::to_string(heads.dv()) +
                " must be at most dim = " + std::to_string(heads.dim));
  std::string dtype;
  if (s.read_string("dtype", dtype)) {
    const auto it = std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](const DType& d) { return dtype == d.name; });
    if (it == std::end(kDTypes))
      s.error("dtype", "unknown dtype '" + dtype + "'; known: bf16, fp16, fp32, fp8");
    else
      heads.dtype_bytes = it->bytes;
  }
  // Only when both were read from this section or both are defaults left valid.
  if ((q_ok || !s.has("q")) && (kv_ok || !s.has("kv")) && heads.q % heads.kv != 0)
    s.error(s.has("kv") ? "kv" : "q", "q = " + std::to_string(heads.q) + " query heads are not a multiple of kv = " +
                                          std::to_string(heads.kv) + " key/value heads");
}

bool read_range(Diagnostics& diag, const YAML::Node& n, const std::string& path, Range& out) {
  if (!n.IsSequence() || n.size() != 2) {
    diag.error(n, path, "expected a range [begin, end], got " + describe(n));
    return false;
  }
  std::int64_t b = 0, e = 0;
  const bool ok = node_int(diag, n[0], path + "[0]", b, 0) && node_int(diag, n[1], path + "[1]", e, 0);
  if (!ok) return false;
  if (e <= b) {
    diag.error(n, path, "empty range [" + std::to_string(b) + ", " + std::to_string(e) + ")");
    return false;
  }
  out = Range{b, e};
  return true;
}

void read_slices(const Section& mask, MaskSpec& spec) {
  const YAML::Node list = mask.get("slices");
  const std::string path = mask.path("slices");
  Diagnostics& diag = mask.diag();
  if (!list.IsSequence()) {
    diag.error(list, path, "expected a list of {q: [b, e], k: [b, e], type: ...}, got " + describe(list));
    return;
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Section s(diag, list[i], path + "[" + std::to_string(i) + "]", {"q", "k", "type"});
    if (!s.valid()) continue;
    Slice slice;
    bool ok = s.require("q") && s.require("k") && s.require("type");
    ok = ok && read_range(diag, s.get("q"), s.path("q"), slice.q);
    ok = ok && read_range(diag, s.get("k"), s.path("k"), slice.k);
    std::string type;
    if (ok && s.read_string("type", type)) {
      if (const auto t = parse_mask_type(type)) {
        slice.type = *t;
        spec.slices.push_back(slice);
      } else {
        s.error("type", "unknown slice type '" + type + "'; known: full, causal, inv_causal, bi_causal");
      }
    }
  }
}

void read_lengths(const Section& mask, MaskSpec& spec) {
  const YAML::Node list = mask.get("lengths");
  if (!list.IsSequence() || list.size() == 0) {
    mask.error("lengths", "expected a non-empty list of document lengths, got " + describe(list));
    return;
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    std::int64_t n = 0;
    if (node_int(mask.diag(), list[i], mask.path("lengths") + "[" + std::to_string(i) + "]", n, 1))
      spec.lengths.push_back(n);
  }
}

// A path to a CSV (relative to the config's folder) or inline [[lo, hi, count], ...].
void read_histogram(const Section& mask, Config& cfg, const std::filesystem::path& base_dir) {
  MaskSpec& spec = cfg.mask;
  const YAML::Node h = mask.get("histogram");
  const std::string path = mask.path("histogram");
  Diagnostics& diag = mask.diag();
  try {
    if (h.IsScalar()) {
      std::filesystem::path file = h.Scalar();
      if (file.is_relative()) file = base_dir / file;
      cfg.input_files.emplace_back(file, mask.path("histogram"));
      spec.histogram = DocHistogram::load_csv(file);
      return;
    }
    if (!h.IsSequence() || h.size() == 0) {
      diag.error(h, path, "expected a CSV file name or a list of [lo, hi, count] bins, got " + describe(h));
      return;
    }
    for (std::size_t i = 0; i < h.size(); ++i) {
      const std::string bpath = path + "[" + std::to_string(i) + "]";
      const YAML::Node b = h[i];
      if (!b.IsSequence() || b.size() != 3) {
        diag.error(b, bpath, "expected a bin [lo, hi, count], got " + describe(b));
        continue;
      }
      DocHistogram::Bin bin;
      if (node_int(diag, b[0], bpath + "[0]", bin.lo, 0) && node_int(diag, b[1], bpath + "[1]", bin.hi, 0) &&
          node_int(diag, b[2], bpath + "[2]", bin.count, 0))
        spec.histogram.bins.push_back(bin);
    }
    if (spec.histogram.bins.size() == h.size()) spec.histogram.validate();
  } catch (const Error& e) {
    diag.error(h, path, e.what());
  }
}

// block_topk / bsr: `block_size: [block_q, block_k]`, or one number for square blocks.
void read_index_block_size(const Section& mask, MaskSpec& spec) {
  const YAML::Node b = mask.get("block_size");
  const std::string path = mask.path("block_size");
  std::int64_t q = 0, k = 0;
  if (b.IsScalar()) {
    if (mask.read_int("block_size", q, 1, std::numeric_limits<std::int32_t>::max())) spec.block_q = spec.block_k = static_cast<int>(q);
  } else if (!b.IsSequence() || b.size() != 2) {
    mask.error("block_size", "expected [block_q, block_k] (query and key block sizes in tokens), got " + describe(b));
  } else if (node_int(mask.diag(), b[0], path + "[0]", q, 1, std::numeric_limits<std::int32_t>::max()) &&
             node_int(mask.diag(), b[1], path + "[1]", k, 1, std::numeric_limits<std::int32_t>::max())) {
    spec.block_q = static_cast<int>(q);
    spec.block_k = static_cast<int>(k);
  }
}

// Index kinds (docs/masks.md): the .npy files (relative to the config's
// folder) and the generators' settings.
void read_index_keys(const Section& mask, Config& cfg, const std::filesystem::path& base_dir) {
  MaskSpec& spec = cfg.mask;
  auto file = [&](const char* key, std::filesystem::path& out) {
    std::string f;
    if (!mask.has(key) || !mask.read_string(key, f)) return;
    if (f.empty()) return mask.error(key, "expected a .npy file name, got an empty string");
    out = f;
    if (out.is_relative()) out = base_dir / out;
    cfg.input_files.emplace_back(out, mask.path(key));
  };
  file("indices", spec.indices_file);
  file("indptr", spec.indptr_file);
  file("full_indptr", spec.full_indptr_file);
  file("full_indices", spec.full_indices_file);
  mask.read_bool("causal", spec.causal);
  if (mask.read_int("kv_heads", spec.kv_heads, 1) && spec.kv_heads != 1 && spec.kv_heads != cfg.heads.kv)
    mask.error("kv_heads", fmt::format("kv_heads = {}: a selection is shared by every head (1) or per KV head "
                                       "(heads.kv = {})",
                                       spec.kv_heads, cfg.heads.kv));
  mask.read_int("topk", spec.topk, 1);
  mask.read_int("sink", spec.sink, 0);
  mask.read_int("local", spec.local, 0);
  mask.read_int("nsa_block", spec.nsa_block, 1, std::numeric_limits<std::int32_t>::max());
  mask.read_int("nsa_top", spec.nsa_top, 1);
  mask.read_int("nsa_initial", spec.nsa_initial, 0);
  mask.read_int("nsa_local", spec.nsa_local, 0);
  const MaskKind k = spec.kind;
  const char* name = k == MaskKind::topk ? "topk" : k == MaskKind::block_topk ? "block_topk" : "bsr";
  if ((k == MaskKind::topk || k == MaskKind::block_topk || k == MaskKind::bsr) && !mask.has("indices"))
    mask.diag().error(mask.node(), mask.path(), fmt::format("kind '{}' needs the key 'indices' (a .npy file)", name));
  if (k == MaskKind::bsr && !mask.has("indptr"))
    mask.diag().error(mask.node(), mask.path(), "kind 'bsr' needs the key 'indptr' (a .npy file)");
  if (k == MaskKind::bsr && mask.has("full_indptr") != mask.has("full_indices"))
    mask.error(mask.has("full_indptr") ? "full_indptr" : "full_indices",
               "full_indptr and full_indices come together (the full blocks' BSR pair)");
}

void read_mask(const Section& mask, Config& cfg, const std::filesystem::path& base_dir, bool sizes_ok) {
  MaskSpec& spec = cfg.mask;
  std::string kind;
  if (mask.require("kind") && mask.read_string("kind", kind) && !parse_mask_kind(kind, spec.kind)) {
    std::string known;
    for (const std::string& k : mask_kind_names()) known += (known.empty() ? "" : ", ") + k;
    for (const std::string& k : index_mask_kind_names()) known += ", " + k;
    mask.error("kind", "unknown mask kind '" + kind + "'; known: " + known);
  }
  if (mask.has("lengths")) read_lengths(mask, spec);
  if (mask.has("histogram")) read_histogram(mask, cfg, base_dir);
  std::int64_t seed = 0;
  if (mask.read_int("seed", seed, 0)) spec.seed = static_cast<std::uint64_t>(seed);
  mask.read_int("pack", spec.pack, 0);
  if (mask.has("window")) {
    const YAML::Node w = mask.get("window");
    std::int64_t l = 0, r = 0;
    if (!w.IsSequence() || w.size() != 2)
      mask.error("window", "expected [left, right], got " + describe(w));
    else if (node_int(mask.diag(), w[0], mask.path("window") + "[0]", l, 0) &&
             node_int(mask.diag(), w[1], mask.path("window") + "[1]", r, 0)) {
      spec.window_left = l;
      spec.window_right = r;
    }
  }
  mask.read_real("prefix_fraction", spec.prefix_fraction, 0.0, 1.0);
  mask.read_real("question_fraction", spec.question_fraction, 0.0, 1.0);
  mask.read_int("num_answers", spec.num_answers, 1);
  if (spec.kind == MaskKind::block_topk || spec.kind == MaskKind::bsr) {
    if (mask.has("block_size")) read_index_block_size(mask, spec);
  } else {
    mask.read_int("block_size", spec.block_size, 1);
  }
  if (mask.has("slices")) read_slices(mask, spec);
  read_index_keys(mask, cfg, base_dir);
  if (spec.kind == MaskKind::slices && !mask.has("slices"))
    mask.diag().error(mask.node(), mask.path(), "kind 'slices' needs the key 'slices'");

  if (sizes_ok && uses_documents(spec.kind) && !spec.lengths.empty()) {
    Token sum = 0;
    for (Token n : spec.lengths) sum += n;
    if (sum != cfg.seqlen())
      mask.error("lengths", "document lengths add up to " + std::to_string(sum) +
                                " tokens, but cp_size * seqlen_per_rank = " + std::to_string(cfg.cp_size) + " * " +
                                std::to_string(cfg.seqlen_per_rank) + " = " + std::to_string(cfg.seqlen()));
  }
}

// What make_mask will generate, estimated from the spec before it runs (its
// time and memory are in proportion to these).
struct MaskSize {
  double sampled_docs = 1;  // documents drawn from the histogram up to the pack asked for
  double slices = 1;
};

MaskSize estimate_mask_size(const MaskSpec& spec, Token S) {
  MaskSize m;
  double docs = 1;
  if (spec.kind == MaskKind::slices) {
    m.slices = static_cast<double>(spec.slices.size());
    return m;
  }
  if (uses_documents(spec.kind)) {
    if (!spec.lengths.empty()) {
      docs = m.sampled_docs = static_cast<double>(spec.lengths.size());
    } else if (!spec.histogram.bins.empty()) {
      // Documents longer than S/4 are cut into S/4 pieces (docs/design.md#masks).
      const double cut = std::max(1.0, static_cast<double>(S) / 4);
      double pieces = 0, tokens = 0;
      for (const DocHistogram::Bin& b : spec.histogram.bins) {
        const double len = std::max(1.0, static_cast<double>(b.representative()));
        const double n = static_cast<double>(b.count) * std::ceil(len / cut);
        pieces += n;
        tokens += static_cast<double>(b.count) * len;
      }
      const double mean = pieces > 0 && tokens > 0 ? tokens / pieces : static_cast<double>(S);
      docs = static_cast<double>(S) / mean + 1;
      m.sampled_docs = docs * (static_cast<double>(spec.pack) + 1);
    }
  }
  switch (spec.kind) {
    case MaskKind::sliding_window: m.slices = 3 * docs; break;
    case MaskKind::prefix_lm: m.slices = 2 * docs; break;
    case MaskKind::share_question: m.slices = (1 + 2 * static_cast<double>(spec.num_answers)) * docs; break;
    case MaskKind::block_causal_document:
      m.slices = docs + static_cast<double>(S) / static_cast<double>(std::max<Token>(1, spec.block_size));
      break;
    default: m.slices = docs; break;
  }
  return m;
}

// The int32 arrays an index kind holds: generated (dsa, nsa) or read (the
// files' sizes, int64 ones narrowed to half).
double index_mask_bytes(const MaskSpec& spec, Token S) {
  const double heads = spec.kv_heads > 0 ? spec.kv_heads : 1;
  // The generators' widths: topk and nsa_top clamped to what exists (S keys, ceil(S / nsa_block) key blocks).
  if (spec.kind == MaskKind::dsa)
    return static_cast<double>(S) * heads * static_cast<double>(std::min<std::int64_t>(spec.topk, S)) * 4;
  if (spec.kind == MaskKind::nsa) {
    const std::int64_t nkb = spec.nsa_block > 0 ? (S + spec.nsa_block - 1) / spec.nsa_block : S;
    return static_cast<double>(S) * heads * static_cast<double>(std::min<std::int64_t>(spec.nsa_top, nkb)) * 4;
  }
  double bytes = 0;
  for (const auto* f : {&spec.indices_file, &spec.indptr_file, &spec.full_indptr_file, &spec.full_indices_file}) {
    std::error_code ec;
    if (!f->empty()) {
      const auto n = std::filesystem::file_size(*f, ec);
      if (!ec) bytes += static_cast<double>(n);
    }
  }
  return bytes;
}

// "raise the budget to at least 4G (memory_budget: 4G in the config, ...)": the
// estimate rounded up to a GiB (a MiB below one).
std::string raise_budget_hint(double need) {
  const double gib = need / static_cast<double>(std::int64_t{1} << 30);
  const std::string to = gib >= 1 ? fmt::format("{}G", static_cast<std::int64_t>(std::ceil(gib)))
                                  : fmt::format("{}M", static_cast<std::int64_t>(std::ceil(need / (1 << 20))));
  return fmt::format("raise the budget to at least {} (memory_budget: {} in the config, --set memory_budget={}, or "
                     "CPSCHED_MEMORY_BUDGET={})",
                     to, to, to, to);
}

// Refuses a mask whose generation alone would pass the slice limit or the
// memory budget (a slice with its validation costs about 200 bytes).
void check_mask_size(const MaskSpec& spec, Token S, std::int64_t configured_budget) {
  const MaskSize m = estimate_mask_size(spec, S);
  const bool by_pack = spec.pack > 0 && !spec.histogram.bins.empty() && spec.lengths.empty();
  if (m.slices > static_cast<double>(limits::kMaxSlices))
    throw LimitError("mask", fmt::format("problem.mask: this mask would have about {:.3g} slices, over the limit "
                                         "2^31 - 1; fewer tokens or longer documents/blocks fit",
                                         m.slices));
  constexpr double kMaxSampledDocs = 4294967296.0;  // 2^32 draws: minutes of sampling
  if (m.sampled_docs > kMaxSampledDocs)
    throw LimitError(by_pack ? "mask.pack" : "mask",
                     fmt::format("problem.mask{}: reaching pack {} samples about {:.3g} documents, over the limit "
                                 "2^32; a lower pack or fewer tokens fit",
                                 by_pack ? ".pack" : "", spec.pack, m.sampled_docs));
  const MemoryBudget budget = memory_budget_or_default(configured_budget, "memory_budget in the config");
  // dsa: its selected pairs follow from the document lengths alone (query j
  // of a document selects min(topk, j + 1) keys), and the sorted rows and
  // the plan's two index pools hold at least 4 bytes per pair each. So a
  // selection that cannot fit is refused before it is generated.
  if (spec.kind == MaskKind::dsa && budget.bytes > 0) {
    const double k = static_cast<double>(std::min<std::int64_t>(spec.topk, S));
    const double heads = spec.kv_heads > 0 ? spec.kv_heads : 1;
    double pairs = 0;
    for (Token len : document_lengths(spec, S)) {
      const auto n = static_cast<double>(len);
      pairs += n <= k ? n * (n + 1) / 2 : k * (k + 1) / 2 + (n - k) * k;
    }
    pairs *= heads;
    const double need = index_mask_bytes(spec, S) + 8 * static_cast<double>(S) * heads + 12 * pairs;
    if (need > static_cast<double>(budget.bytes))
      throw LimitError("mask.topk", fmt::format(
          "problem.mask.topk: this dsa selection ({:.4g} selected pairs, topk {} over S = {}) needs at least {} "
          "(indices {}, their sorted rows and the plan's two index pools {}), over the memory budget {} ({}); {}, or "
          "lower problem.mask.topk or problem.seqlen_per_rank",
          pairs, static_cast<std::int64_t>(k), S, format_bytes(need), format_bytes(index_mask_bytes(spec, S)),
          format_bytes(need - index_mask_bytes(spec, S)), format_bytes(static_cast<double>(budget.bytes)), budget.source,
          raise_budget_hint(need)));
  }
  const double bytes = m.slices * 200 + m.sampled_docs * sizeof(Token) + index_mask_bytes(spec, S);
  if (budget.bytes > 0 && bytes > static_cast<double>(budget.bytes))
    throw LimitError("mask", fmt::format("problem.mask: generating this mask needs about {} ({:.3g} slices), over "
                                         "the memory budget {} ({}); fewer tokens or longer documents/blocks fit, "
                                         "or {}",
                                         format_bytes(bytes), m.slices, format_bytes(static_cast<double>(budget.bytes)),
                                         budget.source, raise_budget_hint(bytes)));
}

// A mask error: at the key of the .npy file it names (errors from files
// start with the file's path), else at the mask; shape errors say where S
// comes from.
void report_index_file_error(const Section& mask, const Config& cfg, std::string msg) {
  if (msg.find("does not match S = ") != std::string::npos)
    msg += fmt::format(" (S = cp_size x seqlen_per_rank = {} x {})", cfg.cp_size, cfg.seqlen_per_rank);
  const MaskSpec& spec = cfg.mask;
  const std::pair<const char*, const std::filesystem::path*> files[] = {{"indices", &spec.indices_file},
                                                                          {"indptr", &spec.indptr_file},
                                                                          {"full_indptr", &spec.full_indptr_file},
                                                                          {"full_indices", &spec.full_indices_file}};
  for (const auto& [key, f] : files)
    if (!f->empty() && mask.has(key) && msg.rfind(f->string() + ":", 0) == 0) return mask.error(key, msg);
  mask.diag().add_at(cfg.mask_loc, mask.path(), msg);
}

}  // namespace

// problem.host_ranges: per rank a list of [begin, end) ranges.
void read_host_ranges(const Section& problem, Config& cfg) {
  const YAML::Node list = problem.get("host_ranges");
  const std::string path = problem.path("host_ranges");
  Diagnostics& diag = problem.diag();
  if (!list.IsSequence()) {
    diag.error(list, path, "expected one list of [begin, end] ranges per rank, got " + describe(list));
    return;
  }
  cfg.host_ranges.assign(list.size(), {});
  for (std::size_t r = 0; r < list.size(); ++r) {
    const std::string rp = path + "[" + std::to_string(r) + "]";
    if (!list[r].IsSequence()) {
      diag.error(list[r], rp, "expected the ranges [[begin, end], ...] rank " + std::to_string(r) + " holds, got " +
                                  describe(list[r]));
      continue;
    }
    for (std::size_t i = 0; i < list[r].size(); ++i) {
      Range x;
      if (read_range(diag, list[r][i], rp + "[" + std::to_string(i) + "]", x)) cfg.host_ranges[r].push_back(x);
    }
  }
}

void read_problem(const Section& problem, Config& cfg, const std::filesystem::path& base_dir) {
  Diagnostics& diag = problem.diag();
  const std::size_t errors_before = diag.count();
  cfg.problem_loc = diag.where(problem.node(), problem.path());

  bool sizes_ok = !problem.has("cp_size") || problem.read_int("cp_size", cfg.cp_size, 1, int(kMaxRanks));
  std::int64_t per_rank = cfg.seqlen_per_rank;
  const bool per_rank_ok = !problem.has("seqlen_per_rank") ||
                           problem.read_int("seqlen_per_rank", per_rank, 1, kMaxTokensPerRank);
  cfg.seqlen_per_rank = per_rank;
  sizes_ok = sizes_ok && per_rank_ok;

  std::string layout;
  if (problem.read_string("layout", layout)) {
    if (layout == "fixed") cfg.layout = Layout::fixed;
    else if (layout == "planned") cfg.layout = Layout::planned;
    else problem.error("layout", "expected fixed or planned, got '" + layout + "'");
  }
  if (problem.has("host_ranges")) read_host_ranges(problem, cfg);

  const Section heads(diag, problem.get("heads"), problem.path("heads"),
                      {"q", "kv", "dim", "dim_qk", "dim_v", "kv_shared", "dtype"});
  read_heads(heads, cfg.heads);

  const Section grid(diag, problem.get("grid"), problem.path("grid"), {"flatten_head_groups", "blocks_per_rank"});
  grid.read_bool("flatten_head_groups", cfg.grid.flatten_head_groups);
  if (grid.read_int("blocks_per_rank", cfg.grid.blocks_per_rank, 1, int(limits::kMaxBlocksPerRank)) && per_rank_ok &&
      cfg.grid.blocks_per_rank > cfg.seqlen_per_rank)
    grid.error("blocks_per_rank", std::to_string(cfg.grid.blocks_per_rank) +
                                      " blocks per rank would be empty: a rank hosts only seqlen_per_rank = " +
                                      std::to_string(cfg.seqlen_per_rank) + " tokens");

  const Section mask(diag, problem.get("mask"), problem.path("mask"),
                     {"kind", "lengths", "histogram", "seed", "pack", "window", "prefix_fraction",
                      "question_fraction", "num_answers", "block_size", "slices",
                      // index kinds
                      "indices", "indptr", "full_indptr", "full_indices", "causal", "kv_heads", "topk", "sink",
                      "local", "nsa_block", "nsa_top", "nsa_initial", "nsa_local"});
  cfg.mask_loc = diag.where(problem.has("mask") ? problem.get("mask") : problem.node(), mask.path());
  if (mask.valid() && problem.has("mask")) read_mask(mask, cfg, base_dir, sizes_ok);

  // Everything read cleanly: build the mask and the problem now, so that
  // `check` also catches what only the whole can show (overlapping slices,
  // a slice outside the sequence, blocks thinner than a token, ...).
  if (diag.count() != errors_before) return;
  // A limit error points at the key that sets the value (limits.hpp).
  auto report_limit = [&](const LimitError& e) {
    std::string msg = e.what();
    const std::string prefix = "problem." + e.key() + ": ";
    if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
    const std::string& k = e.key();
    if (k.rfind("grid.", 0) == 0) grid.error(k.substr(5), msg);
    else if (k.rfind("heads.", 0) == 0) heads.error(k.substr(6), msg);
    else if (k == "mask") diag.add_at(cfg.mask_loc, mask.path(), msg);
    else if (k.rfind("mask.", 0) == 0) mask.error(k.substr(5), msg);
    else problem.error(k, msg);
  };
  RangeMask built;
  std::shared_ptr<const IndexMask> index;
  try {
    // Sizes first: the mask generators allocate in proportion to S.
    check_size_limits(cfg.seqlen(), cfg.cp_size, cfg.grid.blocks_per_rank);
    check_mask_size(cfg.mask, cfg.seqlen(), cfg.memory_budget);
    if (is_index_kind(cfg.mask.kind))
      index = std::make_shared<const IndexMask>(make_index_mask(cfg.mask, cfg.seqlen()));
    else
      built = make_mask(cfg.mask, cfg.seqlen());
  } catch (const LimitError& e) {
    report_limit(e);
    return;
  } catch (const Error& e) {
    report_index_file_error(mask, cfg, e.what());
    return;
  }
  try {
    // make_index_mask validated the entries: not a second pass over them.
    Problem p = index ? make_index_problem(index, cfg.cp_size, cfg.heads, cfg.grid, /*validated=*/true)
                      : Problem::make(std::move(built), cfg.cp_size, cfg.heads, cfg.grid);
    p.set_layout(cfg.layout, cfg.host_ranges);
    // Grid and plan against the memory budget (the executor's own needs are
    // checked where it is known).
    check_resources(p, estimate_resources(p), memory_budget_or_default(cfg.memory_budget, "memory_budget in the config"));
  } catch (const LimitError& e) {
    report_limit(e);
  } catch (const Error& e) {
    diag.add_at(cfg.problem_loc, problem.path(), e.what());
  }
}

}  // namespace cpsched::config_detail
