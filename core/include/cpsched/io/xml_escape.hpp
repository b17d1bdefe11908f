#pragma once
// Escaping text for the SVG and HTML files cpsched writes (plan pictures,
// timelines, compare reports).
#include <string>
#include <string_view>

namespace cpsched {

// &, <, > and " replaced by their entities.
std::string xml_escape(std::string_view s);

}  // namespace cpsched
