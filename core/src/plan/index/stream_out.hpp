#pragma once
// Sequential int32 output that bypasses the caches (non-temporal stores)
// where the CPU has them (SSE2), else plain stores. A rank's index pool is
// tens of MiB, written once and read only later (by the runtime): written
// through the caches, each of its lines is first read from memory (a read
// for ownership), doubling the traffic. Entries are written at 16-byte
// aligned positions in fours, the unaligned ends one by one. finish()
// orders the stores before the writer's thread hands the memory on.
#include <cstddef>
#include <cstdint>
#include <span>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace cpsched::plan_detail {

class StreamOut {
 public:
  explicit StreamOut(std::int32_t* at) : at_(at) {}
  std::int32_t* at() const { return at_; }
  // n entries the caller wrote itself at at() (plain stores).
  void skip(std::size_t n) { at_ += n; }

  // keys[i] + shift.
  void shifted(std::span<const std::int32_t> keys, std::int32_t shift) {
    std::size_t i = head(keys.size(), [&](std::size_t j) { return keys[j] + shift; });
#if defined(__SSE2__)
    const __m128i s = _mm_set1_epi32(shift);
    for (; i + 4 <= keys.size(); i += 4, at_ += 4)
      _mm_stream_si128(reinterpret_cast<__m128i*>(at_),
                       _mm_add_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(keys.data() + i)), s));
#endif
    for (; i < keys.size(); ++i) *at_++ = keys[i] + shift;
  }
  // table[keys[i]]; returns the OR of the values written (negative when a -1 was among them).
  std::int32_t gathered(std::span<const std::int32_t> keys, const std::int32_t* table, std::int32_t& lo,
                        std::int32_t& hi) {
    std::int32_t any = 0;
    auto one = [&](std::size_t j) {
      const std::int32_t v = table[keys[j]];
      any |= v;
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
      return v;
    };
    std::size_t i = head(keys.size(), one);
#if defined(__SSE2__)
    for (; i + 4 <= keys.size(); i += 4, at_ += 4) {
      const std::int32_t a = one(i), b = one(i + 1), c = one(i + 2), d = one(i + 3);
      _mm_stream_si128(reinterpret_cast<__m128i*>(at_), _mm_setr_epi32(a, b, c, d));
    }
#endif
    for (; i < keys.size(); ++i) *at_++ = one(i);
    return any;
  }
  // n copies of v.
  void fill(std::size_t n, std::int32_t v) {
    std::size_t i = head(n, [&](std::size_t) { return v; });
#if defined(__SSE2__)
    const __m128i x = _mm_set1_epi32(v);
    for (; i + 4 <= n; i += 4, at_ += 4) _mm_stream_si128(reinterpret_cast<__m128i*>(at_), x);
#endif
    for (; i < n; ++i) *at_++ = v;
  }
  void finish() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
  }

 private:
  // Entries one by one until the position is 16-byte aligned (or n are written); returns how many.
  template <class F>
  std::size_t head(std::size_t n, F&& value) {
#if defined(__SSE2__)
    std::size_t i = 0;
    for (; i < n && (reinterpret_cast<std::uintptr_t>(at_) & 15) != 0; ++i) *at_++ = value(i);
    return i;
#else
    (void)n;
    (void)value;
    return 0;
#endif
  }

  std::int32_t* at_;
};

}  // namespace cpsched::plan_detail
