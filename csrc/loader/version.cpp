#include "torch_shards/version.h"

namespace torch_shards {

const char* version() { return TORCH_SHARDS_VERSION; }

}  // namespace torch_shards
