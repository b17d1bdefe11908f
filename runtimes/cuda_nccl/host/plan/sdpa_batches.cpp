#include "sdpa_batches.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <map>
#include <tuple>

#include "cpsched/base/error.hpp"
#include "worklist.hpp"

namespace cpsched::gpu {

std::string_view to_string(SdpaMask m) {
  switch (m) {
    case SdpaMask::full: return "full";
    case SdpaMask::causal: return "causal";
    case SdpaMask::inv_causal: return "inv_causal";
    case SdpaMask::bi_causal: return "bi_causal";
  }
  return "?";
}

std::string_view to_string(RouteReason r) {
  static constexpr std::array<std::string_view, kNumRouteReasons> kNames{
      "cudnn", "index_arg", "mode", "no_cudnn", "heads", "rare_band", "offsets", "graph", "empty", "index_rows"};
  return kNames[static_cast<std::size_t>(r)];
}

std::string_view to_string(AttentionMode m) {
  switch (m) {
    case AttentionMode::automatic: return "auto";
    case AttentionMode::cudnn: return "cudnn";
    case AttentionMode::kernels: return "kernels";
  }
  return "?";
}

std::string describe(const SdpaGeometry& g) {
  return fmt::format("{} {}{} B={} heads {}:{} d={} S_q<={} S_kv<={} row heads {}/{} rows {}/{}", to_string(g.pass),
                     to_string(g.mask), g.mask == SdpaMask::bi_causal ? fmt::format(" (band {})", g.band) : "",
                     g.batch, g.q_heads, g.kv_heads, g.dim, g.max_q, g.max_k, g.q_row_heads, g.k_row_heads,
                     g.q_capacity, g.k_capacity);
}

SdpaBounds sdpa_bounds(SdpaMask m, i64 band) {
  switch (m) {
    case SdpaMask::full: return {};
    case SdpaMask::causal: return {true, -1, 0};
    case SdpaMask::inv_causal: return {false, 1, -1};
    case SdpaMask::bi_causal: return {false, 1, band};
  }
  return {};
}

i64 RouteSummary::kernel_args() const {
  i64 n = 0;
  for (std::size_t i = 1; i < args.size(); ++i) n += args[i];
  return n - args[static_cast<std::size_t>(RouteReason::empty)];
}

i64 RouteSummary::kernel_area() const {
  i64 n = 0;
  for (std::size_t i = 1; i < area.size(); ++i) n += area[i];
  return n;
}

void RouteSummary::add(const RouteSummary& o) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    args[i] += o.args[i];
    area[i] += o.area[i];
  }
}

std::string RouteSummary::text() const {
  const double total = static_cast<double>(cudnn_area() + kernel_area());
  auto pct = [&](i64 a) { return total > 0 ? 100.0 * static_cast<double>(a) / total : 0.0; };
  std::string why;
  for (std::size_t i = 1; i < args.size(); ++i)
    if (args[i] > 0 && i != static_cast<std::size_t>(RouteReason::empty))
      why += fmt::format("{}{} {}", why.empty() ? "" : ", ", to_string(static_cast<RouteReason>(i)), args[i]);
  return fmt::format("cuDNN {} args ({:.1f}% of area), own kernels {} ({:.1f}%{}{})", cudnn_args(), pct(cudnn_area()),
                     kernel_args(), pct(kernel_area()), why.empty() ? "" : ": ", why);
}

std::string sdpa_heads_reason(int dim_qk, int dim_v, bool kv_shared, int dtype_bytes) {
  if (dtype_bytes != 2) return fmt::format("dtype of {} bytes (cuDNN's path takes bf16)", dtype_bytes);
  if (dim_qk != dim_v || kv_shared)
    return fmt::format("MLA heads (d_qk {}, d_v {}{})", dim_qk, dim_v, kv_shared ? ", shared latent" : "");
  if (dim_qk % 8 != 0 || dim_qk > 256) return fmt::format("head dim {} (cuDNN takes multiples of 8 up to 256)", dim_qk);
  return "";
}

namespace {

// Packed and in-place extents must index with int32 (the ragged offsets).
constexpr i64 kMaxOffset = std::numeric_limits<std::int32_t>::max();

SdpaMask mask_of(MaskType t) { return static_cast<SdpaMask>(static_cast<int>(t)); }

i64 pow2_at_least(i64 x, i64 floor) {
  i64 p = std::max<i64>(1, floor);
  while (p < x) p *= 2;
  return p;
}

const std::vector<AttnArg>& stage_args(const CalcMeta& calc, std::size_t s) {
  return s == 0 ? calc.local_attn_args : calc.remote_attn_args[s - 1];
}

// The clipped rectangle of a range arg: rows and cols of its band that hold entries.
struct Clip {
  Iv rows, cols;
  i64 area = 0;
};
Clip clip_arg(const AttnArg& a) {
  const Band2 b = band_of(a);
  Clip c{band_rows(b), band_cols(b), band_area(b)};
  return c;
}

// Rows and heads of the buffers a pass reads.
struct Buffers {
  Token local_rows = 0;
  RemoteShape shape;
  const HeadLayout* h = nullptr;
  i64 rows(BufferId b, bool q_side) const {
    return b == BufferId::local ? local_rows : (q_side ? shape.qo_rows : shape.kv_rows);
  }
  i64 row_heads(BufferId b, bool q_side) const {
    return b == BufferId::local ? (q_side ? h->hq : h->hkv) : (q_side ? shape.q_heads : shape.kv_heads);
  }
  // Heads of the batch (a group's, or all) and their first head inside a buffer row.
  int heads(BufferId b, bool q_side, int group) const {
    if (group < 0) return static_cast<int>(row_heads(b, q_side));
    return (q_side ? h->hq : h->hkv) / h->groups;
  }
  int head_off(BufferId b, bool q_side, int group) const {
    if (group < 0 || b == BufferId::remote) return 0;
    return group * ((q_side ? h->hq : h->hkv) / h->groups);
  }
};

}  // namespace

PassRoutes choose_routes(const CalcMeta& calc, const HeadLayout& h, const SdpaPolicy& pol, const RemoteShape& shape,
                         Token local_rows) {
  PassRoutes out;
  const std::size_t n = calc.remote_attn_args.size() + 1;
  out.reason.resize(n);
  const std::string heads = sdpa_heads_reason(h.dim, h.dv(), h.shared, h.dtype_bytes);
  const Buffers buf{local_rows, shape, &h};
  // Elements of an in-place buffer, tail rows included, must fit the ragged offsets.
  auto offsets_fit = [&](BufferId b, bool q_side) {
    return (buf.rows(b, q_side) + kSdpaTailRows) * buf.row_heads(b, q_side) * h.dim <= kMaxOffset;
  };
  std::map<i64, i64> band_area;  // bi_causal diagonal -> area
  for (std::size_t s = 0; s < n; ++s) {
    const auto& args = stage_args(calc, s);
    auto& rs = out.reason[s];
    rs.resize(args.size());
    for (std::size_t i = 0; i < args.size(); ++i) {
      const AttnArg& a = args[i];
      if (a.q.empty() || a.k.empty() || a.q.begin < 0 || a.k.begin < 0 || a.q.end > buf.rows(a.q_buf, true) ||
          a.k.end > buf.rows(a.k_buf, false))
        throw Error(fmt::format("cuda_nccl: stage {} attention arg {} has q [{}, {}) of the {} QO buffer ({} rows) and "
                                "k [{}, {}) of the {} KV buffer ({} rows)",
                                s, i, a.q.begin, a.q.end, a.q_buf == BufferId::local ? "local" : "remote",
                                buf.rows(a.q_buf, true), a.k.begin, a.k.end,
                                a.k_buf == BufferId::local ? "local" : "remote", buf.rows(a.k_buf, false)));
      RouteReason r = RouteReason::cudnn;
      if (a.is_index()) r = RouteReason::index_arg;
      else if (clip_arg(a).area == 0) r = RouteReason::empty;
      else if (range_args_as_index_rows(h)) r = RouteReason::index_rows;
      else if (pol.mode == AttentionMode::kernels) r = RouteReason::mode;
      else if (!pol.backend_lacks.empty()) r = RouteReason::no_cudnn;
      else if (!heads.empty()) r = RouteReason::heads;
      else if (!offsets_fit(a.q_buf, true) || !offsets_fit(a.k_buf, false)) r = RouteReason::offsets;
      else if (s < pol.no_graph.size() && i < pol.no_graph[s].size() && pol.no_graph[s][i]) r = RouteReason::graph;
      rs[i] = r;
      if (r == RouteReason::cudnn && a.type == MaskType::bi_causal) {
        const Clip c = clip_arg(a);
        band_area[c.cols.size() - c.rows.size()] += c.area;
      }
    }
  }
  // bi_causal: the diagonals with the most area get a graph (ties: the smaller band).
  std::vector<std::pair<i64, i64>> bands(band_area.begin(), band_area.end());
  std::stable_sort(bands.begin(), bands.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  std::map<i64, bool> keep;
  for (std::size_t i = 0; i < bands.size(); ++i)
    keep[bands[i].first] = static_cast<int>(i) < pol.max_band_graphs && bands[i].second >= pol.min_band_area;
  for (std::size_t s = 0; s < n; ++s) {
    const auto& args = stage_args(calc, s);
    for (std::size_t i = 0; i < args.size(); ++i) {
      const AttnArg& a = args[i];
      RouteReason& r = out.reason[s][i];
      if (r == RouteReason::cudnn && a.type == MaskType::bi_causal) {
        const Clip c = clip_arg(a);
        if (!keep[c.cols.size() - c.rows.size()]) r = RouteReason::rare_band;
      }
      const i64 area = a.is_index() ? a.index_area : clip_arg(a).area;
      out.summary.args[static_cast<std::size_t>(r)] += 1;
      out.summary.area[static_cast<std::size_t>(r)] += area;
    }
  }
  return out;
}

PassSdpa plan_sdpa(const PassPlan& plan, Pass pass, const HeadLayout& h, const RemoteShape& shape, Token local_rows,
                   const SdpaPolicy& pol) {
  PassSdpa out;
  out.routes = choose_routes(plan.calc, h, pol, shape, local_rows);
  const Buffers buf{local_rows, shape, &h};
  const std::size_t n = plan.calc.remote_attn_args.size() + 1;
  out.batches.resize(n);
  out.kernel_args.resize(n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(h.dim));
  for (std::size_t s = 0; s < n; ++s) {
    const auto& args = stage_args(plan.calc, s);
    auto& batches = out.batches[s];
    // (q_buf, k_buf, group, mask, band) -> the batches of that key, in order of creation.
    std::map<std::tuple<int, int, int, int, i64>, std::vector<std::size_t>> by_key;
    for (std::size_t i = 0; i < args.size(); ++i) {
      const AttnArg& a = args[i];
      const RouteReason r = out.routes.reason[s][i];
      if (r == RouteReason::empty) continue;
      if (r != RouteReason::cudnn) {
        out.kernel_args[s].push_back(a);
        continue;
      }
      const Clip c = clip_arg(a);
      const SdpaMask m = mask_of(a.type);
      const i64 band = m == SdpaMask::bi_causal ? c.cols.size() - c.rows.size() : 0;
      const SdpaSeq seq{c.rows.b, c.rows.size(), c.cols.b, c.cols.size(), 0, 0, c.area, static_cast<std::int32_t>(i)};
      auto& list = by_key[{static_cast<int>(a.q_buf), static_cast<int>(a.k_buf), a.group, static_cast<int>(m), band}];
      // The backward keeps a batch's q rows disjoint: cuDNN may accumulate dQ at the rows' place.
      std::size_t into = batches.size();
      for (std::size_t bi : list) {
        const SdpaBatch& b = batches[bi];
        const bool overlaps = pass == Pass::bwd && std::any_of(b.seqs.begin(), b.seqs.end(), [&](const SdpaSeq& o) {
                                return o.q_row < seq.q_row + seq.q_len && seq.q_row < o.q_row + o.q_len;
                              });
        if (!overlaps) {
          into = bi;
          break;
        }
      }
      if (into == batches.size()) {
        SdpaBatch b;
        b.stage = static_cast<int>(s);
        b.q_buf = a.q_buf;
        b.k_buf = a.k_buf;
        b.group = a.group;
        b.q_head_off = buf.head_off(a.q_buf, true, a.group);
        b.k_head_off = buf.head_off(a.k_buf, false, a.group);
        b.geo.pass = pass;
        b.geo.mask = m;
        b.geo.band = band;
        b.geo.q_heads = buf.heads(a.q_buf, true, a.group);
        b.geo.kv_heads = buf.heads(a.k_buf, false, a.group);
        b.geo.dim = h.dim;
        b.geo.q_row_heads = buf.row_heads(a.q_buf, true);
        b.geo.k_row_heads = buf.row_heads(a.k_buf, false);
        b.q_rows = buf.rows(a.q_buf, true);
        b.k_rows = buf.rows(a.k_buf, false);
        if (pass == Pass::bwd) {
          b.geo.q_capacity = b.q_rows + kSdpaTailRows;
          b.geo.k_capacity = b.k_rows + kSdpaTailRows;
        }
        b.geo.scale = scale;
        batches.push_back(std::move(b));
        list.push_back(into);
      }
      SdpaBatch& b = batches[into];
      b.seqs.push_back(seq);
      b.area += seq.area;
    }
    // Bucketing, dummies, packed rows.
    for (SdpaBatch& b : batches) {
      b.real = static_cast<int>(b.seqs.size());
      i64 mq = 0, mk = 0;
      for (const SdpaSeq& q : b.seqs) {
        mq = std::max(mq, q.q_len);
        mk = std::max(mk, q.k_len);
      }
      // A bi_causal dummy would need band + 1 keys; those batches keep their exact size.
      const int B = b.geo.mask == SdpaMask::bi_causal
                        ? b.real
                        : static_cast<int>(pow2_at_least(b.real, 1));
      // Dummies read the first tail row (zeros) of both buffers: one key each, finite.
      while (static_cast<int>(b.seqs.size()) < B) b.seqs.push_back(SdpaSeq{b.q_rows, 1, b.k_rows, 1, 0, 0, 0, -1});
      b.geo.batch = B;
      b.geo.max_q = pow2_at_least(mq, pol.min_bucket);
      b.geo.max_k = pow2_at_least(mk, pol.min_bucket);
      for (SdpaSeq& q : b.seqs) {
        q.out_q = b.total_q;
        q.out_k = b.total_k;
        b.total_q += q.q_len;
        b.total_k += q.k_len;
      }
      if (b.total_q * b.geo.q_heads * b.geo.dim > kMaxOffset || b.total_k * b.geo.kv_heads * b.geo.dim > kMaxOffset)
        throw Error(fmt::format("cuda_nccl: a cuDNN batch of stage {} packs {} q / {} k rows: beyond 32-bit offsets "
                                "(run with attention: kernels)",
                                s, b.total_q, b.total_k));
      out.max_total_q = std::max(out.max_total_q, b.total_q);
      out.max_total_k = std::max(out.max_total_k, b.total_k);
      out.max_q_heads = std::max<i64>(out.max_q_heads, b.geo.q_heads);
      out.max_kv_heads = std::max<i64>(out.max_kv_heads, b.geo.kv_heads);
    }
  }
  return out;
}

SdpaScratch sdpa_scratch(const SdpaBatch& b) {
  const Bytes q = b.total_q * b.geo.q_heads, k = b.total_k * b.geo.kv_heads, D = b.geo.dim;
  auto up = [](Bytes x) { return (x + 15) / 16 * 16; };
  SdpaScratch s;
  if (b.geo.pass == Pass::fwd) {
    s.stats = up(q * D * 2);
    s.bytes = s.stats + up(q * 4);
  } else {
    s.dk = up(q * D * 2);
    s.dv = s.dk + up(k * D * 2);
    s.stats = s.dv + up(k * D * 2);
    s.bytes = s.stats + up(q * 4);
  }
  return s;
}

SdpaOffsets sdpa_offsets(const SdpaBatch& b) {
  SdpaOffsets o;
  const i64 D = b.geo.dim, qs = b.geo.q_row_heads * D, ks = b.geo.k_row_heads * D;
  const i64 pq = b.geo.q_heads * D, pk = b.geo.kv_heads * D;
  i64 end_q = 0, end_k = 0;
  auto i32 = [](i64 x) { return static_cast<std::int32_t>(x); };
  for (const SdpaSeq& s : b.seqs) {
    o.q.push_back(i32(s.q_row * qs));
    o.k.push_back(i32(s.k_row * ks));
    o.out_q.push_back(i32(s.out_q * pq));
    o.out_stats.push_back(i32(s.out_q * b.geo.q_heads));
    o.out_k.push_back(i32(s.out_k * pk));
    o.seq_q.push_back(i32(s.q_len));
    o.seq_k.push_back(i32(s.k_len));
    end_q = std::max(end_q, s.q_row + s.q_len);
    end_k = std::max(end_k, s.k_row + s.k_len);
  }
  // The last entry: where the rows end (packed: the total).
  o.q.push_back(i32(end_q * qs));
  o.k.push_back(i32(end_k * ks));
  o.out_q.push_back(i32(b.total_q * pq));
  o.out_stats.push_back(i32(b.total_q * b.geo.q_heads));
  o.out_k.push_back(i32(b.total_k * pk));
  return o;
}

std::vector<int> disjoint_layers(const std::vector<Footprint>& targets) {
  std::vector<int> layer(targets.size(), 0);
  std::vector<std::vector<std::size_t>> layers;
  auto overlap = [](const Footprint& a, const Footprint& b) {
    return a.row_b < b.row_e && b.row_b < a.row_e && a.head_b < b.head_e && b.head_b < a.head_e;
  };
  for (std::size_t i = 0; i < targets.size(); ++i) {
    std::size_t l = 0;
    for (; l < layers.size(); ++l)
      if (std::none_of(layers[l].begin(), layers[l].end(), [&](std::size_t j) { return overlap(targets[i], targets[j]); }))
        break;
    if (l == layers.size()) layers.emplace_back();
    layers[l].push_back(i);
    layer[i] = static_cast<int>(l);
  }
  return layer;
}

}  // namespace cpsched::gpu
