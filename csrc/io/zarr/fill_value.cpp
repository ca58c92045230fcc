#include "io/zarr/fill_value.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>

#include "core/errors.h"
#include "io/codecs.h"
#include "io/text.h"

namespace torch_shards::io::zarr {

using core::concat;
using core::ReadError;
using json = nlohmann::json;

namespace {

void store_little_endian(uint64_t bits, size_t size, uint8_t* out) {
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(bits >> (8 * i));
}

std::optional<uint64_t> hex_bits(const json& value) {
  if (!value.is_string()) return std::nullopt;
  const std::string& text = value.get_ref<const std::string&>();
  if (text.size() < 3 || text.size() > 18 || text[0] != '0' || (text[1] != 'x' && text[1] != 'X')) return std::nullopt;
  if (text.find_first_not_of("0123456789abcdefABCDEF", 2) != std::string::npos) return std::nullopt;
  return std::stoull(text.substr(2), nullptr, 16);
}

uint16_t half_from_float(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffff;
  if (magnitude > 0x7f800000) return sign | 0x7e00;                       // NaN
  if (magnitude < 0x38800000) {                                           // zero or subnormal half (below 2^-14)
    const float scaled = std::nearbyint(std::fabs(value) * 16777216.0f);  // units of 2^-24; 1024 is the smallest normal
    return sign | static_cast<uint16_t>(scaled);
  }
  const int32_t exponent = static_cast<int32_t>(magnitude >> 23) - 127 + 15;
  if (exponent >= 31) return sign | 0x7c00;  // overflow, or infinity
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | ((magnitude & 0x7fffff) >> 13);
  const uint32_t rest = magnitude & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // round to nearest even; may carry into infinity
  return sign | static_cast<uint16_t>(half);
}

uint16_t bfloat16_from_float(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

double float_fill(const json& value) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text == "NaN" || text == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (text == "Infinity" || text == "inf") return std::numeric_limits<double>::infinity();
    if (text == "-Infinity" || text == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw std::invalid_argument("not a floating-point value");
}

// One real floating-point value of `size` bytes, little-endian.
void encode_float_fill(const json& value, DType dtype, uint8_t* out) {
  const size_t size = dtype_size(dtype);
  if (const std::optional<uint64_t> bits = hex_bits(value)) return store_little_endian(*bits, size, out);
  const double number = float_fill(value);
  switch (dtype) {
    case DType::kFloat16:
      return store_little_endian(half_from_float(static_cast<float>(number)), 2, out);
    case DType::kBFloat16:
      return store_little_endian(bfloat16_from_float(static_cast<float>(number)), 2, out);
    case DType::kFloat32: {
      const float single = static_cast<float>(number);
      uint32_t bits;
      std::memcpy(&bits, &single, 4);
      return store_little_endian(bits, 4, out);
    }
    default: {
      uint64_t bits;
      std::memcpy(&bits, &number, 8);
      return store_little_endian(bits, 8, out);
    }
  }
}

uint64_t integer_fill(const json& value, DType dtype) {
  if (value.is_boolean()) return value.get<bool>() ? 1 : 0;
  if (const std::optional<uint64_t> bits = hex_bits(value)) return *bits;
  const bool is_signed =
      dtype == DType::kInt8 || dtype == DType::kInt16 || dtype == DType::kInt32 || dtype == DType::kInt64;
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    const int64_t number = value.get<int64_t>();
    if (number < 0 && !is_signed) throw std::invalid_argument("negative value for an unsigned type");
    return static_cast<uint64_t>(number);
  }
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (number != std::floor(number) || std::fabs(number) > 9.2e18) throw std::invalid_argument("not an integer");
    return static_cast<uint64_t>(static_cast<int64_t>(number));
  }
  throw std::invalid_argument("not an integer");
}

}  // namespace

std::vector<uint8_t> numeric_fill_bytes(const ZarrMetadata& meta) {
  const DType dtype = meta.dtype;
  std::vector<uint8_t> bytes(dtype_size(dtype), 0);
  const json& value = meta.fill_value;
  if (value.is_null()) return bytes;
  try {
    switch (dtype) {
      case DType::kBool:
        if (value.is_boolean()) {
          bytes[0] = value.get<bool>();
        } else if (value.is_number()) {
          bytes[0] = value.get<double>() != 0;
        } else {
          throw std::invalid_argument("not a boolean");
        }
        break;
      case DType::kFloat16:
      case DType::kBFloat16:
      case DType::kFloat32:
      case DType::kFloat64:
        encode_float_fill(value, dtype, bytes.data());
        break;
      case DType::kComplex64:
      case DType::kComplex128: {
        const DType part = dtype == DType::kComplex64 ? DType::kFloat32 : DType::kFloat64;
        const size_t half = bytes.size() / 2;
        if (value.is_array()) {
          if (value.size() != 2) throw std::invalid_argument("complex fill_value needs [real, imaginary]");
          encode_float_fill(value[0], part, bytes.data());
          encode_float_fill(value[1], part, bytes.data() + half);
        } else {
          encode_float_fill(value, part, bytes.data());
          encode_float_fill(0.0, part, bytes.data() + half);
        }
        break;
      }
      default:
        store_little_endian(integer_fill(value, dtype), bytes.size(), bytes.data());
        break;
    }
  } catch (const std::exception& error) {
    throw ReadError(concat(meta.where, ": invalid fill_value ", json_text(value), " for ", dtype_name(dtype), " (",
                           error.what(), ")"));
  }
  if (meta.chain.big_endian)
    codecs::byteswap(bytes.data(), bytes.size() / dtype_swap_unit(dtype), dtype_swap_unit(dtype));
  return bytes;
}

}  // namespace torch_shards::io::zarr
