// cpsched: plan and run distributed attention under context parallelism.
#include <csignal>
#include <cstdio>
#include <exception>
#include <fmt/format.h>
#include <map>
#include <new>

#include "commands/commands.hpp"
#include "cpsched/io/atomic_file.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/version.hpp"

namespace {

using Command = int (*)(const cpsched::cli::Args&);

struct Entry {
  Command run;
  const char* summary;
};

const std::map<std::string, Entry>& commands() {
  using namespace cpsched::cli;
  static const std::map<std::string, Entry> table{
      {"plugins", {cmd_plugins, "list the plugins found, with their parameters"}},
      {"check", {cmd_check, "validate a config (and its mask and plugins) only"}},
      {"plan", {cmd_plan, "solve a config and export the plan (JSON, SVG)"}},
      {"run", {cmd_run, "solve, build the plan, execute it and report"}},
      {"compare", {cmd_compare, "sweep solvers x masks x CP sizes into a report"}},
  };
  return table;
}

void usage(std::FILE* out) {
  fmt::print(out, "usage: cpsched <command> [CONFIG] [options]   (cpsched <command> --help for its options)\n\n");
  for (const auto& [name, e] : commands()) fmt::print(out, "  {:<9} {}\n", name, e.summary);
  fmt::print(out, "\nPlugins are searched in <prefix>/lib/cpsched/plugins, CPSCHED_PLUGIN_PATH, the config's\n"
                  "plugin_paths and --plugin-path.\n");
}

// SIGINT / SIGTERM: remove the temporaries of outputs being written (their
// targets are untouched until complete), then die of the signal as before.
extern "C" void on_fatal_signal(int sig) {
  cpsched::remove_pending_atomic_files();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    usage(stdout);
    return 0;
  }
  if (name == "--version") {
    fmt::print("cpsched {}\n", CPSCHED_VERSION_STRING);
    return 0;
  }
  const auto it = commands().find(name);
  if (it == commands().end()) {
    fmt::print(stderr, "cpsched: unknown command '{}'\n\n", name);
    usage(stderr);
    return 2;
  }
  std::signal(SIGINT, on_fatal_signal);
  std::signal(SIGTERM, on_fatal_signal);
  try {
    return it->second.run(cpsched::cli::Args(argv + 2, argv + argc));
  } catch (const std::bad_alloc&) {
    // Under a memory limit: a message and exit 1 (bad input: too large), not SIGABRT.
    std::fprintf(stderr,
                 "cpsched %s: error: out of memory (the problem is too large for the memory available; "
                 "reduce problem.cp_size, seqlen_per_rank or grid.blocks_per_rank)\n",
                 name.c_str());
    return 1;
  } catch (const boost::program_options::error& e) {
    fmt::print(stderr, "cpsched {}: {}\n(see cpsched {} --help)\n", name, e.what(), name);
    return 2;
  } catch (const cpsched::Error& e) {
    fmt::print(stderr, "cpsched {}: error: {}\n", name, e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "cpsched {}: internal error: {}\n", name, e.what());
    return 3;
  }
}
