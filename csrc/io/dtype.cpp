#include "io/dtype.h"

#include <cstdint>
#include <stdexcept>

namespace torch_shards::io {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kInt8:
    case DType::kUInt8:
      return 1;
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
    case DType::kUInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kUInt64:
    case DType::kFloat64:
    case DType::kComplex64:
      return 8;
    case DType::kComplex128:
      return 16;
  }
  return 0;
}

size_t dtype_swap_unit(DType dtype) {
  if (dtype == DType::kComplex64) return 4;
  if (dtype == DType::kComplex128) return 8;
  return dtype_size(dtype);
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return "bool";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt16:
      return "int16";
    case DType::kUInt16:
      return "uint16";
    case DType::kInt32:
      return "int32";
    case DType::kUInt32:
      return "uint32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt64:
      return "uint64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kComplex64:
      return "complex64";
    case DType::kComplex128:
      return "complex128";
  }
  return "?";
}

DType parse_numpy_typestr(const std::string& typestr, bool& big_endian) {
  if (typestr.size() < 3) throw std::invalid_argument("unsupported dtype '" + typestr + "'");
  const char order = typestr[0];
  if (order != '<' && order != '>' && order != '|' && order != '=') {
    throw std::invalid_argument("unsupported dtype '" + typestr + "'");
  }
  big_endian = order == '>';
  const std::string kind_size = typestr.substr(1);
  if (kind_size == "b1") return DType::kBool;
  if (kind_size == "i1") return DType::kInt8;
  if (kind_size == "u1") return DType::kUInt8;
  if (kind_size == "i2") return DType::kInt16;
  if (kind_size == "u2") return DType::kUInt16;
  if (kind_size == "i4") return DType::kInt32;
  if (kind_size == "u4") return DType::kUInt32;
  if (kind_size == "i8") return DType::kInt64;
  if (kind_size == "u8") return DType::kUInt64;
  if (kind_size == "f2") return DType::kFloat16;
  if (kind_size == "f4") return DType::kFloat32;
  if (kind_size == "f8") return DType::kFloat64;
  if (kind_size == "c8") return DType::kComplex64;
  if (kind_size == "c16") return DType::kComplex128;
  throw std::invalid_argument("unsupported dtype '" + typestr + "'");
}

DType parse_zarr_v3_dtype(const std::string& name) {
  static const std::pair<const char*, DType> kNames[] = {
      {"bool", DType::kBool},       {"int8", DType::kInt8},           {"uint8", DType::kUInt8},
      {"int16", DType::kInt16},     {"uint16", DType::kUInt16},       {"int32", DType::kInt32},
      {"uint32", DType::kUInt32},   {"int64", DType::kInt64},         {"uint64", DType::kUInt64},
      {"float16", DType::kFloat16}, {"bfloat16", DType::kBFloat16},   {"float32", DType::kFloat32},
      {"float64", DType::kFloat64}, {"complex64", DType::kComplex64}, {"complex128", DType::kComplex128},
  };
  for (const auto& [text, dtype] : kNames) {
    if (name == text) return dtype;
  }
  throw std::invalid_argument("unsupported data_type '" + name + "'");
}

bool is_integer(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kInt32:
    case DType::kUInt32:
    case DType::kInt64:
    case DType::kUInt64:
      return true;
    default:
      return false;
  }
}

// Element i of a buffer of integers of the given dtype, as int64 (uint64
// values above INT64_MAX saturate: they are out of any valid range anyway).
int64_t integer_at(const uint8_t* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kInt8:
      return reinterpret_cast<const int8_t*>(data)[i];
    case DType::kUInt8:
      return data[i];
    case DType::kInt16:
      return reinterpret_cast<const int16_t*>(data)[i];
    case DType::kUInt16:
      return reinterpret_cast<const uint16_t*>(data)[i];
    case DType::kInt32:
      return reinterpret_cast<const int32_t*>(data)[i];
    case DType::kUInt32:
      return reinterpret_cast<const uint32_t*>(data)[i];
    case DType::kInt64:
      return reinterpret_cast<const int64_t*>(data)[i];
    case DType::kUInt64: {
      const uint64_t value = reinterpret_cast<const uint64_t*>(data)[i];
      return value > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(value);
    }
    default:
      throw std::logic_error("integer_at: not an integer dtype");
  }
}

}  // namespace torch_shards::io
