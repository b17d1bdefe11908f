#pragma once
// Reads typed values from a fuzzer's bytes, front to back; past the end every
// read returns 0, so any input decodes to something.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace cpsched::fuzz {

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  std::uint64_t u64() {
    std::uint64_t v = 0;
    const std::size_t k = n_ < 8 ? n_ : 8;
    std::memcpy(&v, p_, k);
    p_ += k;
    n_ -= k;
    return v;
  }
  std::uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  // In [lo, hi].
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
    return lo + static_cast<std::int64_t>((span <= 0x10000 ? u16() : u64()) % span);
  }
  bool empty() const { return n_ == 0; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

// An invariant of the code under test does not hold: a finding, not a bad input.
[[noreturn]] inline void broken() { std::abort(); }

}  // namespace cpsched::fuzz
