// cuDNN's SDPA for the runtime's batches (cudnn_sdpa.hpp), written against the
// cuDNN frontend's documented graph API (docs/operations/Attention.md).
#include "cudnn_sdpa.hpp"

#include <chrono>
#include <cudnn_frontend.h>
#include <fmt/format.h>
#include <unordered_map>
#include <vector>

#include "cpsched/base/error.hpp"

namespace cpsched::gpu::cudnn {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

namespace {

// Tensor uids of every graph: the variant pack binds pointers by them.
enum Uid : std::int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
  kSeqQ, kSeqK, kQOff, kKOff, kOutQOff, kOutStatsOff, kOutKOff,
};

// The graph of one geometry (validate() only when `sm_version` > 0; the
// device's own otherwise).
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  fe::error_t status;
};

TensorPtr int_tensor(fe::graph::Graph& g, const char* name, std::int64_t uid, std::int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

// A ragged [B, H, S, d] tensor whose rows are `row_heads` heads apart.
fe::graph::Tensor_attributes& ragged(fe::graph::Tensor_attributes& t, const SdpaGeometry& g, std::int64_t heads,
                                     std::int64_t s, std::int64_t row_heads, const TensorPtr& offsets) {
  const std::int64_t d = g.dim;
  return t.set_dim({g.batch, heads, s, d}).set_stride({s * row_heads * d, d, row_heads * d, 1}).set_ragged_offset(offsets);
}

TensorPtr input(fe::graph::Graph& g, const char* name, std::int64_t uid, const SdpaGeometry& geo, std::int64_t heads,
                std::int64_t s, std::int64_t row_heads, const TensorPtr& offsets) {
  auto a = fe::graph::Tensor_attributes().set_name(name).set_uid(uid);
  return g.tensor(ragged(a, geo, heads, s, row_heads, offsets));
}

// The stats: [B, Hq, S_q, 1] fp32, packed [T, Hq].
void stats_layout(fe::graph::Tensor_attributes& t, const SdpaGeometry& g, const TensorPtr& offsets) {
  t.set_dim({g.batch, g.q_heads, g.max_q, 1})
      .set_stride({g.max_q * g.q_heads, 1, g.q_heads, 1})
      .set_data_type(fe::DataType_t::FLOAT)
      .set_ragged_offset(offsets);
}

template <class Attr>
void set_mask(Attr& a, const SdpaGeometry& g) {
  const SdpaBounds b = sdpa_bounds(g.mask, g.band);
  a.set_diagonal_alignment(b.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT : fe::DiagonalAlignment_t::TOP_LEFT);
  if (b.left >= 0) a.set_diagonal_band_left_bound(static_cast<int>(b.left));
  if (b.right >= 0) a.set_diagonal_band_right_bound(static_cast<int>(b.right));
}

Built build_graph(const SdpaGeometry& g, int sm_version) {
  Built out;
  out.graph = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& gr = *out.graph;
  gr.set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (sm_version > 0) gr.set_sm_version(sm_version);
  const std::int64_t B = g.batch;
  auto seq_q = int_tensor(gr, "seq_q", kSeqQ, B), seq_k = int_tensor(gr, "seq_kv", kSeqK, B);
  auto q_off = int_tensor(gr, "q_offsets", kQOff, B + 1), k_off = int_tensor(gr, "kv_offsets", kKOff, B + 1);
  auto out_q_off = int_tensor(gr, "out_q_offsets", kOutQOff, B + 1);
  auto out_stats_off = int_tensor(gr, "stats_offsets", kOutStatsOff, B + 1);
  auto q = input(gr, "Q", kQ, g, g.q_heads, g.max_q, g.q_row_heads, q_off);
  auto k = input(gr, "K", kK, g, g.kv_heads, g.max_k, g.k_row_heads, k_off);
  auto v = input(gr, "V", kV, g, g.kv_heads, g.max_k, g.k_row_heads, k_off);
  if (g.pass == Pass::fwd) {
    auto attr = fe::graph::SDPA_attributes()
                    .set_name("sdpa")
                    .set_generate_stats(true)
                    .set_attn_scale(g.scale)
                    .set_padding_mask(true)
                    .set_seq_len_q(seq_q)
                    .set_seq_len_kv(seq_k);
    set_mask(attr, g);
    auto [o, stats] = gr.sdpa(q, k, v, attr);
    ragged(o->set_output(true).set_uid(kO), g, g.q_heads, g.max_q, g.q_heads, out_q_off);
    stats_layout(stats->set_output(true).set_uid(kStats), g, out_stats_off);
  } else {
    auto out_k_off = int_tensor(gr, "out_kv_offsets", kOutKOff, B + 1);
    auto o = input(gr, "O", kO, g, g.q_heads, g.max_q, g.q_row_heads, q_off);
    auto d_o = input(gr, "dO", kDO, g, g.q_heads, g.max_q, g.q_row_heads, q_off);
    auto sa = fe::graph::Tensor_attributes().set_name("stats").set_uid(kStats);
    stats_layout(sa, g, out_stats_off);
    auto stats = gr.tensor(sa);
    auto attr = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_backward")
                    .set_attn_scale(g.scale)
                    .set_padding_mask(true)
                    .set_seq_len_q(seq_q)
                    .set_seq_len_kv(seq_k)
                    .set_max_total_seq_len_q(g.q_capacity)
                    .set_max_total_seq_len_kv(g.k_capacity)
                    .set_deterministic_algorithm(true);
    set_mask(attr, g);
    auto [dq, dk, dv] = gr.sdpa_backward(q, k, v, o, d_o, stats, attr);
    ragged(dq->set_output(true).set_uid(kDQ), g, g.q_heads, g.max_q, g.q_heads, out_q_off);
    ragged(dk->set_output(true).set_uid(kDK), g, g.kv_heads, g.max_k, g.kv_heads, out_k_off);
    ragged(dv->set_output(true).set_uid(kDV), g, g.kv_heads, g.max_k, g.kv_heads, out_k_off);
  }
  out.status = gr.validate();
  return out;
}

void check(const fe::error_t& e, const char* step, const SdpaGeometry& g) {
  if (e.is_bad())
    throw Error(fmt::format("cuda_nccl: cuDNN SDPA ({}), {}: {}", describe(g), step, e.err_msg));
}

void check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw Error(fmt::format("cuda_nccl: {}: {}", what, cudnnGetErrorString(s)));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("cuda_nccl: {}: {}", what, cudaGetErrorString(e)));
}

std::string version_text(std::size_t v) {
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

}  // namespace

bool built() { return true; }

std::string describe_build() {
  return fmt::format("cuDNN {} (headers {}), frontend {}.{}.{}", version_text(cudnnGetVersion()),
                     version_text(CUDNN_VERSION), CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
                     CUDNN_FRONTEND_PATCH_VERSION);
}

std::string validate(const SdpaGeometry& g, int sm_version) {
  try {
    const Built b = build_graph(g, sm_version);
    return b.status.is_good() ? "" : b.status.err_msg;
  } catch (const std::exception& e) {
    return e.what();
  }
}

struct Runner::Impl {
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  std::vector<std::pair<SdpaGeometry, std::shared_ptr<fe::graph::Graph>>> graphs;
  void* workspace = nullptr;
  std::int64_t workspace_bytes = 0;
  double build_s = 0;
};

Runner::Runner(cudaStream_t stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  check(cudnnCreate(&impl_->handle), "cudnnCreate");
  const cudnnStatus_t s = cudnnSetStream(impl_->handle, stream);
  if (s != CUDNN_STATUS_SUCCESS) {
    cudnnDestroy(impl_->handle);
    check(s, "cudnnSetStream");
  }
}

Runner::~Runner() {
  // Best effort: a destructor must not throw.
  if (impl_->stream != nullptr) cudaStreamSynchronize(impl_->stream);
  if (impl_->workspace != nullptr) cudaFree(impl_->workspace);
  impl_->graphs.clear();
  if (impl_->handle != nullptr) cudnnDestroy(impl_->handle);
}

int Runner::prepare(const SdpaGeometry& g) {
  Impl& m = *impl_;
  for (std::size_t i = 0; i < m.graphs.size(); ++i)
    if (m.graphs[i].first == g) return static_cast<int>(i);
  const auto t0 = std::chrono::steady_clock::now();
  Built b = build_graph(g, 0);
  check(b.status, "validate", g);
  fe::graph::Graph& gr = *b.graph;
  check(gr.build_operation_graph(m.handle), "build_operation_graph", g);
  check(gr.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans", g);
  check(gr.check_support(m.handle), "check_support", g);
  check(gr.build_plans(m.handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans", g);
  std::int64_t ws = 0;
  check(gr.get_workspace_size(ws), "get_workspace_size", g);
  if (ws > m.workspace_bytes) {
    // Before any pass (the pipeline prepares every graph first); still, nothing may use the old one.
    check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize(cuDNN workspace)");
    if (m.workspace != nullptr) check(cudaFree(m.workspace), "cudaFree(cuDNN workspace)");
    m.workspace = nullptr;
    m.workspace_bytes = 0;
    check(cudaMalloc(&m.workspace, static_cast<std::size_t>(ws)), "cudaMalloc(cuDNN workspace)");
    m.workspace_bytes = ws;
  }
  m.build_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.graphs.emplace_back(g, std::move(b.graph));
  return static_cast<int>(m.graphs.size()) - 1;
}

void Runner::run(int graph, const SdpaBind& b) {
  Impl& m = *impl_;
  if (graph < 0 || static_cast<std::size_t>(graph) >= m.graphs.size())
    throw Error(fmt::format("cuda_nccl (internal): SDPA graph {} was never prepared", graph));
  const auto& [g, gr] = m.graphs[static_cast<std::size_t>(graph)];
  auto ptr = [](const void* p) { return const_cast<void*>(p); };
  std::unordered_map<std::int64_t, void*> pack{{kQ, ptr(b.q)},
                                               {kK, ptr(b.k)},
                                               {kV, ptr(b.v)},
                                               {kSeqQ, ptr(b.seq_q)},
                                               {kSeqK, ptr(b.seq_k)},
                                               {kQOff, ptr(b.q_off)},
                                               {kKOff, ptr(b.k_off)},
                                               {kOutQOff, ptr(b.out_q_off)},
                                               {kOutStatsOff, ptr(b.out_stats_off)}};
  if (g.pass == Pass::fwd) {
    pack.emplace(kO, b.out_o);
    pack.emplace(kStats, b.out_stats);
  } else {
    pack.emplace(kO, ptr(b.o));
    pack.emplace(kDO, ptr(b.d_o));
    pack.emplace(kStats, ptr(b.stats));
    pack.emplace(kDQ, b.dq);
    pack.emplace(kDK, b.dk);
    pack.emplace(kDV, b.dv);
    pack.emplace(kOutKOff, ptr(b.out_k_off));
  }
  check(gr->execute(m.handle, pack, m.workspace), "execute", g);
}

SdpaStats Runner::stats() const {
  return {static_cast<int>(impl_->graphs.size()), impl_->build_s, static_cast<Bytes>(impl_->workspace_bytes)};
}

}  // namespace cpsched::gpu::cudnn
