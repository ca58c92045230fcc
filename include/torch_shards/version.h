#pragma once

#include "torch_shards/export.h"

namespace torch_shards {

// The library's version, "major.minor.patch".
TORCH_SHARDS_API const char* version();

}  // namespace torch_shards
