// Element types of on-disk arrays (those torch can hold).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace torch_shards::io {

enum class DType {
  kBool,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kComplex64,
  kComplex128,
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // numpy-style: "float32", "bool", ...
bool is_integer(DType dtype);
// Element i of a buffer of integers of the given dtype, as int64 (uint64
// values above INT64_MAX saturate: they are out of any valid range anyway).
int64_t integer_at(const uint8_t* data, DType dtype, size_t i);
// The bytes swapped to reverse a big-endian element (half the size for complex).
size_t dtype_swap_unit(DType dtype);

// numpy array-protocol type strings as zarr v2 writes them: "<f4", "|b1", ">i8".
// Sets big_endian; throws std::invalid_argument for anything else.
DType parse_numpy_typestr(const std::string& typestr, bool& big_endian);
// zarr v3 data_type names: "float32", "bool", "uint16", "complex64", ...
DType parse_zarr_v3_dtype(const std::string& name);

}  // namespace torch_shards::io
