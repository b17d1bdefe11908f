#pragma once
// The benchmarks' standard workload: one pack of seed 42 of a named mask over
// P ranks, 8192 tokens per rank, GQA 64:8, D 128, bf16, flattened head groups.
#include <memory>
#include <string>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched::bench {

// full, causal, full_document or causal_document.
inline MaskKind standard_mask_kind(const std::string& name) {
  if (name == "full") return MaskKind::full;
  if (name == "causal") return MaskKind::causal;
  if (name == "full_document") return MaskKind::full_document;
  if (name == "causal_document") return MaskKind::causal_document;
  throw Error("unknown mask '" + name + "' (full, causal, full_document, causal_document)");
}

inline std::shared_ptr<const Problem> standard_problem(const std::string& mask, const DocHistogram& hist, int pack,
                                                       int cp_size, Layout layout) {
  MaskSpec spec;
  spec.kind = standard_mask_kind(mask);
  spec.histogram = hist;
  spec.seed = 42;
  spec.pack = pack;
  Problem made = Problem::make(make_mask(spec, Token{8192} * cp_size), cp_size, Heads{64, 8, 128, 2});
  made.set_layout(layout);
  return std::make_shared<const Problem>(std::move(made));
}

}  // namespace cpsched::bench
