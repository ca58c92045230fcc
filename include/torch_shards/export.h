// Symbols of the torch_shards library that C++ programs may use. Everything
// else in the library is hidden (-fvisibility=hidden).
#pragma once

// Marks a class or function as exported from libtorch_shards.so (default visibility).
#define TORCH_SHARDS_API __attribute__((visibility("default")))
