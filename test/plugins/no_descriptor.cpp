// A shared object that is not a cpsched plugin: it exports no descriptor. Its
// initialiser leaves a mark, so a test can see that the host never ran it.
#include <cstdlib>

extern "C" __attribute__((visibility("default"))) int cpsched_test_not_a_plugin() { return 42; }

namespace {
const int kMark = [] { return ::setenv("CPSCHED_TEST_NO_DESCRIPTOR_INITIALISED", "1", 1); }();
}  // namespace

extern "C" __attribute__((visibility("default"))) int cpsched_test_mark() { return kMark; }
