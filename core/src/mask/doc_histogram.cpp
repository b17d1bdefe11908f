// DocHistogram: the CSV reader and the checks a histogram must pass before
// documents are sampled from it.
#include <charconv>
#include <sstream>
#include <limits>
#include <string>
#include <string_view>

#include "cpsched/base/error.hpp"
#include "cpsched/io/input_file.hpp"
#include "cpsched/mask/generators.hpp"

namespace cpsched {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool parse_int(std::string_view s, std::int64_t& out) {
  s = trim(s);
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end;
}

// One data row: `"[lo, hi]",count[,anything...]`. Returns an empty string on
// success, else what is wrong.
std::string parse_row(std::string_view line, DocHistogram::Bin& bin) {
  line = trim(line);
  std::string_view range;
  std::string_view rest;
  if (!line.empty() && line.front() == '"') {
    const auto close = line.find('"', 1);
    if (close == std::string_view::npos) return "unterminated quote";
    range = line.substr(1, close - 1);
    rest = trim(line.substr(close + 1));
    if (rest.empty() || rest.front() != ',') return "expected ',' after the quoted range";
    rest.remove_prefix(1);
  } else {
    return "expected a quoted range \"[lo, hi]\" as the first field";
  }
  range = trim(range);
  if (range.size() < 2 || range.front() != '[' || range.back() != ']')
    return "expected a range \"[lo, hi]\", got \"" + std::string(range) + "\"";
  range = range.substr(1, range.size() - 2);
  const auto comma = range.find(',');
  if (comma == std::string_view::npos) return "expected \"[lo, hi]\", got \"[" + std::string(range) + "]\"";
  if (!parse_int(range.substr(0, comma), bin.lo) || !parse_int(range.substr(comma + 1), bin.hi))
    return "range bounds must be integers, got \"[" + std::string(range) + "]\"";
  const std::string_view count = rest.substr(0, rest.find(','));
  if (!parse_int(count, bin.count)) return "count must be an integer, got \"" + std::string(trim(count)) + "\"";
  return {};
}

}  // namespace

DocHistogram DocHistogram::load_csv(const std::filesystem::path& file) {
  // A regular file of bounded size (a FIFO or /dev/zero is refused, not read without end).
  constexpr std::uint64_t kMaxHistogramBytes = 64u << 20;
  std::istringstream in(read_input_file(file, kMaxHistogramBytes, "document-length histogram (CSV)"));
  DocHistogram hist;
  std::string line;
  int line_no = 0;
  bool header = true;
  while (std::getline(in, line)) {
    ++line_no;
    if (header) {  // the first line names the columns
      header = false;
      continue;
    }
    if (trim(line).empty()) continue;
    Bin bin;
    const std::string why = parse_row(line, bin);
    if (!why.empty()) throw Error(file.string() + ":" + std::to_string(line_no) + ": " + why);
    hist.bins.push_back(bin);
  }
  if (hist.bins.empty()) throw Error(file.string() + ": no histogram rows after the header line");
  try {
    hist.validate();
  } catch (const Error& e) {
    throw Error(file.string() + ": " + e.what());
  }
  return hist;
}

void DocHistogram::validate() const {
  if (bins.empty()) throw Error("document-length histogram has no bins");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < bins.size(); ++i) {
    const Bin& b = bins[i];
    const std::string name =
        "histogram bin " + std::to_string(i) + " [" + std::to_string(b.lo) + ", " + std::to_string(b.hi) + "]";
    if (b.lo < 0 || b.hi < b.lo) throw Error(name + ": needs 0 <= lo <= hi");
    if (b.count < 0) throw Error(name + ": count must be >= 0, got " + std::to_string(b.count));
    // A bin that can be drawn must give documents of at least one token.
    if (b.count > 0 && b.representative() < 1) throw Error(name + ": its midpoint length is 0 tokens");
    if (b.count > std::numeric_limits<std::int64_t>::max() - total)
      throw Error("document-length histogram: total count overflows 64 bits");
    total += b.count;
  }
  if (total == 0) throw Error("document-length histogram: every bin has count 0");
}

}  // namespace cpsched
