// Decoding zarr chunks: undoing the bytes->bytes codecs (compressors,
// checksums) and the transposes of a chunk's codec chain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "io/chunked_array.h"
#include "io/zarr/metadata.h"

namespace torch_shards::io::zarr {

// Checks and strips the little-endian CRC-32C that ends `data`.
void strip_crc32c(std::vector<uint8_t>& data);

// Undoes bytes->bytes codecs, last first. `decoded_size`, when known, is the
// size once all are undone. With `out` (which has room for decoded_size
// bytes), a final decompression writes there directly, saving a copy; returns
// whether it did, else `data` holds the decoded bytes.
bool undo_bytes_codecs(const std::vector<BytesCodec>& chain, std::vector<uint8_t>& data,
                       std::optional<size_t> decoded_size, uint8_t* out);

// Decodes the fixed-size elements of one chunk (numeric or fixed-length
// strings) of shape `chunk_shape` encoded by `chain`: bytes->bytes codecs,
// then the transposes, into C order.
std::shared_ptr<const ChunkDecoder> make_chunk_decoder(const CodecChain& chain, const std::vector<int64_t>& chunk_shape,
                                                       size_t item_size);

}  // namespace torch_shards::io::zarr
