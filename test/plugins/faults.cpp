// A plugin descriptor written by hand so that it can carry exactly one fault,
// chosen by a FAULT_* definition. The macros of cpsched/plugin.hpp cannot
// produce these faults, but a stale or foreign build can.
#include <cstddef>
#include <cstdio>

#include <boost/dll/alias.hpp>

#include "cpsched/plugin/abi.hpp"

namespace {

void* create(const void*, char* error, std::size_t n) {
  std::snprintf(error, n, "faulty test plugin: never made");
  return nullptr;
}
void destroy(void*) {}

#ifdef FAULT_BAD_DEFAULT
#define COUNT_DEFAULT "abc"
#else
#define COUNT_DEFAULT "3"
#endif

const cpsched_param_spec kParams[] = {
    {"count", CPSCHED_PARAM_INT, COUNT_DEFAULT, "how many"},
#ifdef FAULT_BAD_PARAM_TYPE
    {"mystery", 9, "1", "a parameter of no known type"},
#endif
#ifdef FAULT_DUPLICATE_PARAM
    {"count", CPSCHED_PARAM_INT, "4", "the same name again"},
#endif
};

#ifdef FAULT_LONG_DOC
// 5000 characters and a NUL: over the host's 4 KiB bound for descriptor text.
struct LongDoc {
  char text[5001];
  constexpr LongDoc() : text() {
    for (int i = 0; i < 5000; ++i) text[i] = 'x';
  }
};
constexpr LongDoc kLongDoc;
#define DOC kLongDoc.text
#elif defined(FAULT_HEAP_DOC)
// Text the plugin made at load time on the heap: outside its image, so the
// host does not read it (it cannot bound such a read).
struct HeapText {
  char* p;
  HeapText() : p(new char[17]) {
    const char text[] = "made on the heap";
    for (std::size_t i = 0; i < sizeof text; ++i) p[i] = text[i];
  }
  ~HeapText() { delete[] p; }  // at dlclose: no leak for LeakSanitizer
};
const char* heap_doc() {
  static HeapText text;
  return text.p;
}
#define DOC heap_doc()
#else
#define DOC "a plugin with one deliberate fault"
#endif

}  // namespace

extern "C" {
const cpsched_plugin_descriptor_t faulty_descriptor = {
#ifdef FAULT_BAD_ABI
    CPSCHED_PLUGIN_ABI_VERSION + 41,
#else
    CPSCHED_PLUGIN_ABI_VERSION,
#endif
#ifdef FAULT_SMALL_DESCRIPTOR
    offsetof(cpsched_plugin_descriptor_t, create),
#else
    sizeof(cpsched_plugin_descriptor_t),
#endif
#ifdef FAULT_BAD_SIGNATURE
    "gcc-0;libstdc++-cxx11abi0;cpsched-0.0.0",
#else
    CPSCHED_BUILD_SIGNATURE,
#endif
#ifdef FAULT_BAD_KIND
    7,
#else
    CPSCHED_KIND_SOLVER,
#endif
#ifdef FAULT_BAD_NAME
    "no spaces allowed",
#else
    "faulty",
#endif
    DOC,
    kParams,
#ifdef FAULT_HUGE_NUM_PARAMS
    // One real entry, a count that would read a gigabyte past it.
    std::uint32_t{1} << 30,
#else
    static_cast<std::uint32_t>(sizeof(kParams) / sizeof(kParams[0])),
#endif
    &create,
    &destroy};
}

BOOST_DLL_ALIAS(faulty_descriptor, cpsched_plugin_descriptor)
