// BufferRecycler: buffers come back when their last holder lets go and are
// handed out again (the smallest idle one that fits), at most `keep` idle.
#include <doctest/doctest.h>

#include <memory>
#include <thread>
#include <vector>

#include "cpsched/base/buffer_recycler.hpp"

using namespace cpsched;

TEST_CASE("a released buffer is handed out again, the smallest idle one that fits") {
  BufferRecycler r(2);
  std::int32_t* first = nullptr;
  {
    auto a = r.take(100);
    first = a.get();
    a[99] = 7;
    CHECK(r.idle() == 0);
  }
  CHECK(r.idle() == 1);
  CHECK(r.idle_entries() == 100);
  {
    auto b = r.take(50);  // fits in the idle one
    CHECK(b.get() == first);
    CHECK(r.idle() == 0);
    auto c = r.take(10);  // none idle: a new one
    CHECK(c.get() != first);
  }
  CHECK(r.idle() == 2);
  CHECK(r.idle_entries() == 110);
  auto d = r.take(5);  // the smallest that fits: the 10
  CHECK(d.get() != first);
  auto e = r.take(101);  // none fits: a new one
  CHECK(e.get() != first);
  CHECK(r.idle() == 1);
}

TEST_CASE("at most `keep` idle buffers; the smallest go first") {
  BufferRecycler r(2);
  {
    auto a = r.take(10), b = r.take(20), c = r.take(30);
  }
  CHECK(r.idle() == 2);
  CHECK(r.idle_entries() == 50);
  BufferRecycler none(0);
  { auto a = none.take(10); }
  CHECK(none.idle() == 0);
}

TEST_CASE("a buffer may outlive its recycler, and take_buffer works without one") {
  std::shared_ptr<std::int32_t[]> kept;
  {
    BufferRecycler r;
    kept = r.take(1000);
    kept[999] = 1;
  }
  CHECK(kept[999] == 1);
  kept.reset();  // freed, not returned (ASan checks the memory)
  auto own = take_buffer(nullptr, 3);
  own[2] = 3;
  CHECK(own[2] == 3);
}

TEST_CASE("buffers taken and released on several threads") {
  BufferRecycler r(4);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&r, t] {
      for (int i = 0; i < 200; ++i) {
        auto b = r.take(static_cast<std::size_t>(64 + (i + t) % 7));
        b[0] = t;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(r.idle() <= 4);
}
