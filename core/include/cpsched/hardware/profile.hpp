#pragma once
// A hardware profile for the timing model (configs/hardware/*.yaml): attention
// throughput, optionally the kernel model (kernel_model.hpp: tiles, rates by
// mask form and length, fixed costs), sustained HBM bandwidth (pack / unpack
// / merge kernels), the two link classes (inside a node, between nodes) and
// whether communication runs concurrently with compute.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cpsched/hardware/kernel_model.hpp"
#include "cpsched/hardware/node_map.hpp"

namespace cpsched {

// The profile used where none is named (the cost model, the sim, compare).
inline constexpr const char* kDefaultHardwareProfile = "h100_8x_nvlink";

struct Link {
  double bandwidth_gb_s = 0;  // GB/s (1e9 bytes per second), one direction, per GPU
  double latency_us = 0;      // once per port per collective (grouped messages overlap it), see timing.hpp
  friend bool operator==(const Link&, const Link&) = default;
};

struct HardwareProfile {
  std::string name;
  std::string description;
  std::string source;           // file or "bundled:<name>", for messages
  double fwd_tflops = 0;        // peak attention throughput, TFLOP/s: the compute bound's rate, and
  double bwd_tflops = 0;        // without a kernel model every arg's (its exact area at this rate)
  std::optional<KernelModel> kernel;  // how the kernels compute each arg (file key `kernel`); none: as above
  double hbm_gb_s = 0;          // sustained HBM bandwidth of copy kernels, GB/s (read + write counted);
                                // required in files; 0 (code only) charges no HBM kernels
  int gpus_per_node = 8;
  Link intra_node;
  Link inter_node;
  bool overlap = true;          // communication on its own stream, concurrent with compute

  NodeMap nodes() const { return {gpus_per_node}; }
  const Link& link(int a, int b) const { return nodes().same_node(a, b) ? intra_node : inter_node; }
  friend bool operator==(const HardwareProfile&, const HardwareProfile&) = default;
};

// Parses a profile; `source` names the text in messages. Throws cpsched::Error
// naming the source and the key (unknown keys are errors listing the known ones).
HardwareProfile parse_hardware_profile(const std::string& yaml_text, const std::string& source);
HardwareProfile load_hardware_profile(const std::filesystem::path& file);

// The profiles compiled into the plugin (the files of configs/hardware/).
std::vector<std::string> bundled_hardware_names();

// `spec` is a bundled name (e.g. "h100_8x_nvlink") or a path to a YAML file
// (anything with a '/' or ending in .yaml / .yml).
HardwareProfile resolve_hardware_profile(const std::string& spec);

}  // namespace cpsched
