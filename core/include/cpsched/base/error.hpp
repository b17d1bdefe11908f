#pragma once
// The one exception type of the library: a message that is already precise
// (it names the file, line, key or value at fault).
#include <stdexcept>
#include <string>

namespace cpsched {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An Error raised by (or about) a plugin rather than by the input: its
// factory, solve or execute failed, or the plugin's file did not load. Bindings
// tell the two apart (Python: RuntimeError vs ValueError); the CLI does not.
class PluginError : public Error {
 public:
  using Error::Error;
};

}  // namespace cpsched
