#pragma once
// Index arrays from NumPy .npy files (index masks, index_mask.hpp).
#include <filesystem>

#include "cpsched/mask/index/index_mask.hpp"

namespace cpsched {

// Loads an int32 or int64 array (little-endian, C order, 1 to 3 dimensions);
// int64 is narrowed to int32 (a value outside int32 is an error). The array's
// `source` is the path. Throws cpsched::Error naming the file: not found, not
// an .npy file, a dtype other than '<i4' / '<i8' (the message says which),
// Fortran order, a file shorter than its header's shape needs (truncated) or
// longer, a header that is not NumPy's dict literal (a shape entry that is not
// a non-negative integer: "a", 1024.0), a rank outside 1-3, or a path that is
// not a regular file (a FIFO is refused, not waited on).
IndexArray load_index_npy(const std::filesystem::path& path);

// True: the reader has no optional dependency any more (it once used
// xtensor's header parser); kept for callers that asked.
bool npy_supported();

}  // namespace cpsched
