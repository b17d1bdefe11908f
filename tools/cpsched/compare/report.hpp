#pragma once
// Outputs of `cpsched compare`: terminal table, CSV, Markdown, SVG charts and
// an index.html that shows them all (offline, no scripts).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "compare/sweep.hpp"

namespace cpsched::cli {

// What produced a report, for its headers.
struct ReportContext {
  std::string command;       // the command line that regenerates it
  std::string config;        // the config file
  std::string timing_label;  // empty: no timing figures
  bool with_ilp = false;     // `ilp` is compared: the tables have a "gap to ilp" column
  std::vector<std::string> warnings;
};

// The aggregated rows as text tables, one section per (heads, mask).
struct TextTable {
  std::string title;
  std::vector<std::string> headers;
  std::vector<std::string> units;
  std::vector<std::vector<std::string>> rows;
};
std::vector<TextTable> summary_tables(const CompareResult& res, const CompareSpec& spec);

void print_compare_tables(std::FILE* out, const std::vector<TextTable>& tables);
void write_compare_markdown(const std::filesystem::path& file, const std::vector<TextTable>& tables,
                            const ReportContext& ctx, const std::vector<std::string>& chart_files);

// The CSV columns, in order (the checker and docs rely on these names).
const std::vector<std::string>& compare_csv_columns();
void write_compare_csv(const std::filesystem::path& file, const CompareResult& res);

struct ChartFile {
  std::string file;   // relative to the report folder
  std::string title;
  std::string group;  // e.g. the mask: charts of a group sit together
};
std::vector<ChartFile> write_compare_charts(const std::filesystem::path& dir, const CompareResult& res);

void write_compare_html(const std::filesystem::path& file, const std::vector<TextTable>& tables,
                        const std::vector<ChartFile>& charts, const ReportContext& ctx);

}  // namespace cpsched::cli
