// A shared object that is not a cpsched plugin: it exports no descriptor.
extern "C" __attribute__((visibility("default"))) int cpsched_test_not_a_plugin() { return 42; }
