// Index-mask ingestion (docs/masks.md, "Ingestion cost"): count_index_cells
// over DSA-like token top-k indices held in memory, S = 131072, k = 2048,
// H_kv = 1 (268M int32 indices, 1 GiB), sequential blocks of P = 8, 32, 64.
// Prints the median of 5 calls and the peak resident memory the call adds
// (VmHWM after resetting it with /proc/self/clear_refs) over the index bytes.
//
//   bench_index_ingest [--seqlen N] [--topk K] [--threads T] [--repeats R]
//                      [--source fill|dsa] [--shuffle]
// fill: sinks (64) + local window (512) + evenly strided keys with a random
// offset per row, one document (fast to make); dsa: make_index_mask's dsa
// generator (documents from the bundled histogram).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "bench_common.hpp"
#include "cpsched/mask/index/cells.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/problem.hpp"

using namespace cpsched;

namespace {

// kB from /proc/self/status ("VmHWM:   12345 kB").
long status_kb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stol(line.substr(key.size() + 1));
  return -1;
}

// CPU seconds of the process so far (all threads).
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

bool reset_peak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  return static_cast<bool>(out);
}

std::vector<std::int32_t> fill_indices(Token S, Token k) {
  std::vector<std::int32_t> ix(static_cast<std::size_t>(S * k));
  const Token sink = std::min<Token>(64, k), local = std::min<Token>(512, k - sink), mid = k - sink - local;
  const int T = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int t = 0; t < T; ++t)
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::uniform_real_distribution<double> u(0.0, 1.0);
      for (Token i = S * t / T; i < S * (t + 1) / T; ++i) {
        std::int32_t* row = ix.data() + i * k;
        Token j = 0;
        if (i + 1 <= k) {
          for (; j <= i; ++j) row[j] = static_cast<std::int32_t>(j);
        } else {
          for (Token x = 0; x < sink; ++x) row[j++] = static_cast<std::int32_t>(x);
          const Token m = i + 1 - local - sink;  // keys [sink, i + 1 - local) to pick `mid` from
          const double off = u(rng);
          for (Token x = 0; x < mid; ++x)
            row[j++] = static_cast<std::int32_t>(sink + static_cast<Token>((static_cast<double>(x) + off) * static_cast<double>(m) / static_cast<double>(mid)));
          for (Token x = i + 1 - local; x <= i; ++x) row[j++] = static_cast<std::int32_t>(x);
        }
        for (; j < k; ++j) row[j] = -1;
      }
    });
  for (auto& th : pool) th.join();
  return ix;
}

}  // namespace

int main(int argc, char** argv) {
  bench::check_args(argc, argv, "bench_index_ingest", {"--seqlen", "--topk", "--threads", "--repeats", "--source"}, {"--shuffle"});
  const Token S = std::stoll(bench::arg(argc, argv, "--seqlen", "131072"));
  const Token k = std::stoll(bench::arg(argc, argv, "--topk", "2048"));
  const int threads = std::stoi(bench::arg(argc, argv, "--threads", "2"));
  const int repeats = std::stoi(bench::arg(argc, argv, "--repeats", "5"));
  const std::string source = bench::arg(argc, argv, "--source", "fill");
  // Rows in random order (torch.topk returns keys by score, not by position).
  const bool shuffle = bench::flag(argc, argv, "--shuffle");

  IndexMask mask;
  std::vector<std::int32_t> data;
  if (source == "dsa") {
    MaskSpec spec;
    spec.kind = MaskKind::dsa;
    spec.histogram = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));
    spec.topk = k;
    const auto t0 = std::chrono::steady_clock::now();
    mask = make_index_mask(spec, S);
    fmt::print("dsa generator + validation: {:.2f} s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } else {
    data = fill_indices(S, k);
    mask.kind = IndexMaskKind::topk;
    mask.seqlen = S;
    mask.indices = IndexArray::view(data, {S, 1, k}, "<bench>");
  }
  if (shuffle) {
    // The generator's rows are shared memory: shuffle a copy.
    data.assign(mask.indices.span().begin(), mask.indices.span().end());
    std::mt19937_64 rng(99);
    for (Token i = 0; i < S; ++i) std::shuffle(data.begin() + i * k, data.begin() + (i + 1) * k, rng);
    mask.indices = IndexArray::view(data, {S, 1, k}, mask.indices.source);
  }
  const double index_bytes = static_cast<double>(mask.indices.size()) * 4.0;
  fmt::print("count_index_cells: {}{} top-k, S = {}, k = {}, H_kv = 1, {:.0f}M indices ({:.2f} GiB), threads = {}\n",
             source, shuffle ? " (rows shuffled)" : "", S, k, static_cast<double>(mask.indices.size()) / 1e6, index_bytes / (1 << 30), threads);
  fmt::print("median of {} calls; extra memory = peak RSS growth during one call / index bytes\n", repeats);
  fmt::print("(machine shared with other builds: figures are upper bounds)\n\n");
  // The method's check: touching 64 MiB after a reset must show as +64 MiB.
  if (reset_peak()) {
    const long before = status_kb("VmRSS");
    {
      std::vector<char> probe(std::size_t{64} << 20, 1);
      probe[probe.size() / 2] = static_cast<char>(threads);  // keep it
      if (probe[12345] != 1) return 3;
    }
    fmt::print("peak-RSS probe: a 64 MiB buffer reads as +{:.1f} MiB\n\n", static_cast<double>(status_kb("VmHWM") - before) / 1024.0);
  } else {
    fmt::print("cannot reset the peak RSS (/proc/self/clear_refs): extra memory not measured\n\n");
  }
  fmt::print("cpu s = CPU time per call over all threads (wall > cpu s / threads: the machine was busy)\n");
  fmt::print("{:>4} {:>8} {:>12} {:>10} {:>8} {:>12} {:>8}   {}\n", "P", "cells", "area", "median s", "cpu s",
             "extra MiB", "ratio", "target: <= 1.5 s, ratio <= 0.5");
  for (int P : {8, 32, 64}) {
    const Sharding sh = Sharding::sequential(S, P);
    IndexCountOptions opt;
    opt.threads = threads;
    std::size_t cells = 0;
    Token area = 0;
    const double cpu0 = cpu_seconds();
    const double ms = bench::median_ms(repeats, [&] {
      const auto c = count_index_cells(mask, sh.blocks, opt);
      cells = c.size();
      area = 0;
      for (const auto& x : c) area += x.area;
    });
    const double cpu = (cpu_seconds() - cpu0) / repeats;
    // One more call for memory: peak growth over the resident set before it.
    double extra_mib = -1;
    if (reset_peak()) {
      const long before = status_kb("VmRSS");
      { const auto c = count_index_cells(mask, sh.blocks, opt); cells = c.size(); }
      extra_mib = static_cast<double>(status_kb("VmHWM") - before) / 1024.0;
    }
    const double ratio = extra_mib * 1024.0 * 1024.0 / index_bytes;
    fmt::print("{:>4} {:>8} {:>12} {:>10.3f} {:>8.3f} {:>12.1f} {:>8.3f}   {}\n", P, cells, area, ms / 1000.0, cpu,
               extra_mib, ratio,
               ms <= 1500.0 && ratio <= 0.5 ? "ok" : "MISSED");
  }
  return 0;
}
