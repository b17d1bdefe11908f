// Fuzz target: configuration text + `--set` overrides (cpsched::parse_config),
// then the problem it describes (make_problem) when that is small.
//
// Input: YAML text. Lines that start with "#set " are also passed as
// overrides (`#set problem.cp_size=4`): YAML reads them as comments, so one
// input holds both. A bad input must end in cpsched::Error; anything else
// (a crash, a sanitizer report, another exception) is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "cpsched/config/config.hpp"
#include "cpsched/base/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    if (text.compare(at, 5, "#set ") == 0) overrides.push_back(text.substr(at + 5, end - at - 5));
    at = end + 1;
  }
  try {
    const cpsched::Config cfg = cpsched::parse_config(text, "fuzz.yaml", overrides);
    // Building the problem materialises the mask and the sharding: only for
    // sizes this target is about (limits and memory are other checks' job).
    if (cfg.cp_size <= 64 && cfg.seqlen() <= (cpsched::Token{1} << 16) && cfg.grid.blocks_per_rank <= 8) {
      (void)cpsched::make_problem(cfg);
    }
  } catch (const cpsched::Error&) {
    // a located error: what a bad input must give
  }
  return 0;
}
