#pragma once
// Index arrays from NumPy .npy files (index masks, index_mask.hpp).
#include <filesystem>

#include "cpsched/mask/index/index_mask.hpp"

namespace cpsched {

// Loads an int32 or int64 array (little-endian, C order, 1 to 3 dimensions);
// int64 is narrowed to int32 (a value outside int32 is an error). The array's
// `source` is the path. Throws cpsched::Error naming the file: not found, not
// an .npy file, a dtype other than '<i4' / '<i8' (the message says which),
// Fortran order, a file shorter than its header's shape needs (truncated),
// or a rank outside 1-3.
IndexArray load_index_npy(const std::filesystem::path& path);

// False when cpsched was built without xtensor (its .npy header reader);
// load_index_npy then throws, saying how to get it.
bool npy_supported();

}  // namespace cpsched
