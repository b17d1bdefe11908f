#pragma once
// Small helpers shared by the benchmark programs: medians and the bundled data.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

namespace cpsched::bench {

template <class F>
double median_ms(int repeats, F&& f) {
  std::vector<double> v;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The bundled histogram: argv's --data-dir, else the source tree's configs/data.
inline std::filesystem::path data_file(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--data-dir") return std::filesystem::path(argv[i + 1]) / name;
#ifdef CPSCHED_SOURCE_DIR
  return std::filesystem::path(CPSCHED_SOURCE_DIR) / "configs" / "data" / name;
#else
  return std::filesystem::path("configs") / "data" / name;
#endif
}

// Refuses what a benchmark does not take, before it runs for minutes on its
// defaults: every argument must be one of `valued` followed by its value, one
// of `flags`, or --data-dir DIR; --help lists them. Exits 2 on a wrong one, 0
// after --help.
inline void check_args(int argc, char** argv, const char* program, std::initializer_list<const char*> valued,
                       std::initializer_list<const char*> flags = {}) {
  auto usage = [&](std::FILE* to) {
    std::fprintf(to, "usage: %s", program);
    for (const char* v : valued) std::fprintf(to, " [%s V]", v);
    for (const char* f : flags) std::fprintf(to, " [%s]", f);
    std::fprintf(to, " [--data-dir DIR]\n(the source file's first comment says what each does)\n");
  };
  auto in = [](std::initializer_list<const char*> names, const std::string& a) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return a == n; });
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      std::exit(0);
    }
    if (in(flags, a)) continue;
    if (in(valued, a) || a == "--data-dir") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\n", program, a.c_str());
        std::exit(2);
      }
      ++i;
      continue;
    }
    std::fprintf(stderr, "%s: unknown argument '%s'\n", program, a.c_str());
    usage(stderr);
    std::exit(2);
  }
}

// `--name value` from the command line, else `def`.
inline std::string arg(int argc, char** argv, const std::string& name, const std::string& def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return def;
}

// Whether `--name` is on the command line.
inline bool flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

}  // namespace cpsched::bench
