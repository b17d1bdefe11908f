#pragma once
// Large int32 buffers that return when their last holder lets go, for work
// that needs buffers of the same size call after call: a Session's per-rank
// top-k plans make a rank's sorted rows and its index pool, tens of MiB each,
// on every call. A fresh buffer that large is a fresh mapping whose every
// page faults on its first write (and is unmapped again when freed); a
// returned one is already mapped. What a buffer holds never depends on
// whether it was reused: callers write every entry they read.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace cpsched {

class BufferRecycler {
 public:
  // Keeps at most `keep` idle buffers (the smallest go first).
  explicit BufferRecycler(std::size_t keep = 2);
  ~BufferRecycler();
  BufferRecycler(const BufferRecycler&) = delete;
  BufferRecycler& operator=(const BufferRecycler&) = delete;

  // A buffer of at least n entries, contents unspecified: an idle one that
  // fits (the smallest such), else a new one of n entries. When its last
  // shared_ptr goes it returns here, or is freed when the recycler is gone.
  // Thread safe.
  std::shared_ptr<std::int32_t[]> take(std::size_t n);
  // Idle buffers held, and their entries (for tests).
  std::size_t idle() const;
  std::size_t idle_entries() const;

 private:
  struct Shelf;
  std::shared_ptr<Shelf> shelf_;
};

// A buffer of n entries from `r`, or a new one when r is null.
std::shared_ptr<std::int32_t[]> take_buffer(BufferRecycler* r, std::size_t n);

}  // namespace cpsched
