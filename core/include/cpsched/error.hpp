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

}  // namespace cpsched
