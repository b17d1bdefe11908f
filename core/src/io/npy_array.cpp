// load_index_npy (npy_array.hpp). The header's dictionary is parsed here,
// strictly (NumPy's format: a Python dict literal with exactly the keys
// 'descr', 'fortran_order' and 'shape', the shape a tuple of non-negative
// integers), and the magic, header length, dtype, sizes and data are checked,
// so that every failure names the file and what is wrong: a shape of
// ("a", 1, 16) or (1024.0, 1, 16) is refused, not read as something else, and
// nothing is allocated in proportion to a header before the file is known to
// hold that many bytes. The file is opened as an InputFile: a FIFO or device
// is refused, never waited on.
#include "cpsched/io/npy_array.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>


#include "cpsched/base/error.hpp"
#include "cpsched/io/input_file.hpp"

namespace cpsched {

namespace {

std::string shape_string(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string index_string(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_string(idx);
}

// "int32", "big-endian float64", "bool", ... for a typestring like "<i4".
std::string describe_dtype(const std::string& t) {
  if (t.size() < 3) return "unknown";
  std::string kind;
  switch (t[1]) {
    case 'i': kind = "int"; break;
    case 'u': kind = "uint"; break;
    case 'f': kind = "float"; break;
    case 'c': kind = "complex"; break;
    case 'b': return "bool";
    case 'U': return "unicode string";
    case 'S': return "byte string";
    case 'O': return "Python object";
    default: return "unknown";
  }
  int bytes = 0;
  for (std::size_t i = 2; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i) bytes = bytes * 10 + (t[i] - '0');
  const std::string name = kind + std::to_string(bytes * 8);
  return t[0] == '>' ? "big-endian " + name : name;
}

// The header dictionary, parsed strictly: {'descr': '<i4', 'fortran_order':
// False, 'shape': (2, 3), } with any spacing, keys in any order, each once,
// an optional trailing comma, then only spaces up to the final newline.
// Throws a message (without the file name) on anything else.
struct NpyHeader {
  std::string descr;
  bool fortran = false;
  std::vector<std::uint64_t> shape;
};

class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : t_(text) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_fortran = false, have_shape = false;
    ws();
    expect('{');
    for (;;) {
      ws();
      if (peek() == '}') break;
      const std::string key = string_literal("a key");
      ws();
      expect(':');
      ws();
      if (key == "descr") {
        if (have_descr) fail("the key 'descr' appears twice");
        have_descr = true;
        h.descr = string_literal("the value of 'descr'");
      } else if (key == "fortran_order") {
        if (have_fortran) fail("the key 'fortran_order' appears twice");
        have_fortran = true;
        if (starts("True")) h.fortran = true, i_ += 4;
        else if (starts("False")) h.fortran = false, i_ += 5;
        else fail("'fortran_order' must be True or False, got " + near());
      } else if (key == "shape") {
        if (have_shape) fail("the key 'shape' appears twice");
        have_shape = true;
        h.shape = shape_tuple();
      } else {
        fail("unknown key '" + key + "' (an .npy header has 'descr', 'fortran_order' and 'shape')");
      }
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      ws();
      if (peek() != '}') fail("expected ',' or '}' after the value of '" + key + "', got " + near());
    }
    expect('}');
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t')) ++i_;
    if (i_ + 1 != t_.size() || t_[i_] != '\n') fail("unexpected text after the dictionary: " + near());
    if (!have_descr) fail("no 'descr'");
    if (!have_fortran) fail("no 'fortran_order'");
    if (!have_shape) fail("no 'shape'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw std::runtime_error(why); }
  char peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
  bool starts(std::string_view w) const { return t_.compare(i_, w.size(), w) == 0; }
  void ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(fmt::format("expected '{}', got {}", c, near()));
    ++i_;
  }
  // What the parser sees at the current position, quoted and cut short.
  std::string near() const {
    if (i_ >= t_.size()) return "the end of the header";
    std::string s = t_.substr(i_, 16);
    for (char& c : s)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
    return "'" + s + (t_.size() - i_ > 16 ? "...'" : "'");
  }
  std::string string_literal(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') fail(fmt::format("expected {} as a quoted string, got {}", what, near()));
    const std::size_t b = ++i_;
    while (i_ < t_.size() && t_[i_] != q) {
      if (t_[i_] == '\\' || t_[i_] == '\n') fail(fmt::format("{}: escapes and newlines are not allowed", what));
      ++i_;
    }
    if (i_ >= t_.size()) fail(fmt::format("{}: the string is not closed", what));
    return t_.substr(b, i_++ - b);
  }
  // (), (n,), (a, b), (a, b, c,): non-negative decimal integers only (a
  // Python 2 'L' suffix allowed); a float, string or sign is an error.
  std::vector<std::uint64_t> shape_tuple() {
    std::vector<std::uint64_t> dims;
    expect('(');
    ws();
    bool need_comma = false;
    while (peek() != ')') {
      if (need_comma) fail("'shape': expected ',' or ')' between dimensions, got " + near());
      if (dims.size() == 32) fail("'shape' has more than 32 dimensions");
      const std::size_t b = i_;
      std::uint64_t v = 0;
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
        const auto d = static_cast<std::uint64_t>(t_[i_] - '0');
        if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) fail("'shape': a dimension does not fit 64 bits");
        v = v * 10 + d;
        ++i_;
      }
      if (i_ == b) {
        i_ = b;
        fail("'shape': dimensions are non-negative integers, got " + near());
      }
      if (peek() == 'L') ++i_;
      const char c = peek();
      if (c != ',' && c != ')' && c != ' ' && c != '\t') {
        i_ = b;
        fail("'shape': dimensions are non-negative integers, got " + near());
      }
      dims.push_back(v);
      ws();
      if (peek() == ',') {
        ++i_;
        ws();
        need_comma = false;
      } else {
        need_comma = true;
      }
    }
    // A one-element tuple needs its comma: "(5)" is the integer 5 in Python.
    if (dims.size() == 1 && need_comma) fail("'shape': a one-dimensional shape is written (n,), got (n)");
    expect(')');
    return dims;
  }

  const std::string& t_;
  std::size_t i_ = 0;
};

std::uint32_t le(const unsigned char* p, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

bool npy_supported() { return true; }

IndexArray load_index_npy(const std::filesystem::path& path) {
  const std::string src = path.string();
  InputFile in(path, ".npy file");
  const std::uint64_t file_size = in.size();

  // Magic "\x93NUMPY", version, header length (2 bytes in v1, 4 in v2/v3).
  unsigned char pre[12] = {};
  if (in.read(pre, 8) < 8 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    throw Error(src + ": not an .npy file (it does not start with \\x93NUMPY)");
  const int major = pre[6];
  if (major < 1 || major > 3) throw Error(fmt::format("{}: .npy format version {}.{} is not supported (1 to 3 are)", src, major, pre[7]));
  const int len_bytes = major == 1 ? 2 : 4;
  if (in.read(pre + 8, static_cast<std::size_t>(len_bytes)) < static_cast<std::size_t>(len_bytes))
    throw Error(src + ": truncated .npy header");
  const std::uint64_t header_len = le(pre + 8, len_bytes);
  const std::uint64_t offset = 8 + static_cast<std::uint64_t>(len_bytes) + header_len;
  if (offset > file_size)
    throw Error(fmt::format("{}: truncated .npy header ({} bytes announced, the file has {} bytes)", src, header_len, file_size));
  // NumPy writes headers of a few hundred bytes (and reads at most 10000 by default).
  constexpr std::uint64_t kMaxHeaderBytes = 1u << 16;
  if (header_len > kMaxHeaderBytes)
    throw Error(fmt::format("{}: the .npy header announces {} bytes (at most {})", src, header_len, kMaxHeaderBytes));
  std::string header(static_cast<std::size_t>(header_len), '\0');
  if (in.read(header.data(), header.size()) != header.size()) throw Error(src + ": truncated .npy header");

  NpyHeader h;
  try {
    h = HeaderParser(header).parse();
  } catch (const std::runtime_error& e) {
    throw Error(fmt::format("{}: not an .npy file (bad header: {})", src, e.what()));
  }
  const std::string& descr = h.descr;
  const bool is32 = descr == "<i4", is64 = descr == "<i8";
  if (!is32 && !is64)
    throw Error(fmt::format("{}: dtype '{}' ({}) is not accepted; index arrays are int32 or int64, little-endian ('<i4' "
                            "or '<i8')",
                            src, descr, describe_dtype(descr)));
  const bool fortran = h.fortran;
  std::vector<std::int64_t> shape;
  std::uint64_t count = 1;
  for (std::uint64_t d : h.shape) {
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        (d > 0 && count > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / 8 / d))
      throw Error(fmt::format("{}: shape dimension {} is too large", src, d));
    shape.push_back(static_cast<std::int64_t>(d));
    count *= d;
  }
  if (shape.empty() || shape.size() > 3)
    throw Error(fmt::format("{}: shape {} has {} dimensions; index arrays have 1 to 3", src, shape_string(shape), shape.size()));
  if (fortran && shape.size() > 1)
    throw Error(src + ": Fortran order is not accepted; save the array in C order (numpy.ascontiguousarray)");
  const std::uint64_t word = is32 ? 4 : 8;
  const std::uint64_t need = count * word;
  if (file_size - offset < need)
    throw Error(fmt::format("{}: truncated: shape {} of {} needs {} bytes of data, the file has {}", src,
                            shape_string(shape), is32 ? "int32" : "int64", need, file_size - offset));
  if (file_size - offset > need)
    throw Error(fmt::format("{}: shape {} of {} needs {} bytes of data, but the file has {} (a wrong shape in the "
                            "header?)",
                            src, shape_string(shape), is32 ? "int32" : "int64", need, file_size - offset));

  static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");
  auto buf = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(count));
  auto short_read = [&] { return Error(src + ": truncated: the file ended while reading its data"); };
  if (is32) {
    if (in.read(buf->data(), static_cast<std::size_t>(need)) != need) throw short_read();
  } else {
    // Narrow in chunks: no second full-size buffer.
    std::vector<std::int64_t> chunk(std::size_t{1} << 20);
    for (std::uint64_t at = 0; at < count;) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk.size(), count - at);
      if (in.read(chunk.data(), static_cast<std::size_t>(n * 8)) != n * 8) throw short_read();
      for (std::uint64_t x = 0; x < n; ++x) {
        const std::int64_t v = chunk[x];
        if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
          throw Error(fmt::format("{}: entry {} = {} does not fit int32", src,
                                  index_string(static_cast<std::int64_t>(at + x), shape), v));
        (*buf)[at + x] = static_cast<std::int32_t>(v);
      }
      at += n;
    }
  }
  return IndexArray::own(std::move(buf), std::move(shape), src);
}

}  // namespace cpsched
