#include "loader/device_decode.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "core/errors.h"
#include "core/stopwatch.h"
#include "io/decode_plan/cpu_executor.h"

namespace torch_shards {

using core::concat;
using io::decode_plan::ChunkKind;
using io::decode_plan::DecodePlan;
using io::decode_plan::NvcompDecompressAsync;
using io::decode_plan::NvcompDecompressAsyncV4;
using io::decode_plan::NvcompDecompressOptions;
using io::decode_plan::NvcompDecompressor;
using io::decode_plan::NvcompDecompressTempSize;
using io::decode_plan::NvcompDecompressTempSizeV4;
using io::decode_plan::NvcompLibrary;
using io::decode_plan::Piece;
using io::decode_plan::PieceCodec;
using io::decode_plan::Shuffle;
using io::decode_plan::Unshuffle;

namespace {

// Of every buffer nvCOMP reads or writes (nvCOMP 6 asks 4 bytes for LZ4 and
// Deflate, 8 for Zstd; 16 is what its headers suggest for speed).
constexpr uint64_t kAlign = 16;

uint64_t aligned(uint64_t size) { return (size + kAlign - 1) / kAlign * kAlign; }

at::Tensor device_bytes(c10::Device device, uint64_t size) {
  return at::empty({static_cast<int64_t>(size)}, at::TensorOptions().dtype(at::kByte).device(device));
}

// Host memory the device copies from: pinned for CUDA (the copy does not wait).
at::Tensor host_tensor(c10::Device device, int64_t count, at::ScalarType type) {
  return at::empty({count}, at::TensorOptions().dtype(type).pinned_memory(device.is_cuda()));
}

// The host tensor on `device`, copied on the current stream (the pinned
// allocator keeps the host memory until the copy ended).
at::Tensor upload(const at::Tensor& host, c10::Device device) {
  if (device.is_cpu()) return host;
  at::Tensor out = at::empty(host.sizes(), host.options().device(device).pinned_memory(false));
  out.copy_(host, /*non_blocking=*/true);
  return out;
}

at::Tensor upload_longs(const std::vector<int64_t>& values, c10::Device device) {
  at::Tensor host = host_tensor(device, static_cast<int64_t>(values.size()), at::kLong);
  if (!values.empty()) std::memcpy(host.data_ptr<int64_t>(), values.data(), values.size() * sizeof(int64_t));
  return upload(host, device);
}

// A view of `bytes` (1-D uint8) with the given sizes and strides in bytes, starting at `offset`.
at::Tensor strided(const at::Tensor& bytes, at::IntArrayRef sizes, at::IntArrayRef strides, uint64_t offset) {
  return bytes.as_strided(sizes, strides, bytes.storage_offset() + static_cast<int64_t>(offset));
}

// Blocks of one shape (same shuffle, typesize and size) laid out as Q runs of
// L blocks: block (q, l) at from + q * outer_from + l * inner_from, and so on.
struct Grid {
  uint64_t from = 0, to = 0;
  int64_t outer = 1, inner = 1;
  int64_t outer_from = 0, outer_to = 0, inner_from = 0, inner_to = 0;
};

// The blocks (from, to), in plan order, as few grids as describe them: one
// when runs of equal length repeat at equal strides (every full block of
// every chunk), else one per run of equally spaced blocks.
std::vector<Grid> grids_of(const std::vector<std::pair<uint64_t, uint64_t>>& blocks) {
  std::vector<Grid> runs;
  for (size_t i = 0; i < blocks.size();) {
    Grid run{blocks[i].first, blocks[i].second};
    size_t j = i + 1;
    if (j < blocks.size()) {
      run.inner_from = static_cast<int64_t>(blocks[j].first - blocks[i].first);
      run.inner_to = static_cast<int64_t>(blocks[j].second - blocks[i].second);
      while (j < blocks.size() && static_cast<int64_t>(blocks[j].first - blocks[j - 1].first) == run.inner_from &&
             static_cast<int64_t>(blocks[j].second - blocks[j - 1].second) == run.inner_to) {
        ++j;
      }
    }
    if (run.inner_from < 0 || run.inner_to < 0) j = i + 1;  // as_strided takes no negative stride
    run.inner = static_cast<int64_t>(j - i);
    if (run.inner == 1) run.inner_from = run.inner_to = 0;
    runs.push_back(run);
    i = j;
  }
  if (runs.size() < 2) return runs;
  Grid grid = runs[0];
  grid.outer = static_cast<int64_t>(runs.size());
  grid.outer_from = static_cast<int64_t>(runs[1].from - runs[0].from);
  grid.outer_to = static_cast<int64_t>(runs[1].to - runs[0].to);
  if (grid.outer_from < 0 || grid.outer_to < 0) return runs;
  for (size_t r = 1; r < runs.size(); ++r) {
    const bool same = runs[r].inner == grid.inner && runs[r].inner_from == grid.inner_from &&
                      runs[r].inner_to == grid.inner_to &&
                      static_cast<int64_t>(runs[r].from - runs[r - 1].from) == grid.outer_from &&
                      static_cast<int64_t>(runs[r].to - runs[r - 1].to) == grid.outer_to;
    if (!same) return runs;
  }
  return {grid};
}

// Byte unshuffle (c-blosc's): in a block of n elements of t bytes, byte j of
// element i is byte j * n + i of the shuffled block.
void byte_unshuffle(const at::Tensor& scratch, const at::Tensor& staging, const Grid& g, int64_t n, int64_t t) {
  const at::Tensor from = strided(scratch, {g.outer, g.inner, n, t}, {g.outer_from, g.inner_from, 1, n}, g.from);
  strided(staging, {g.outer, g.inner, n, t}, {g.outer_to, g.inner_to, t, 1}, g.to).copy_(from);
}

// Bit unshuffle (c-blosc's, as bit_unshuffle in cpu_executor.h): the first n
// elements (a multiple of 8) as t * 8 bit planes of n / 8 bytes; bit k of
// byte j of element i is bit i % 8 of byte i / 8 of plane 8 j + k.
void bit_unshuffle(const at::Tensor& scratch, const at::Tensor& staging, const Grid& g, int64_t n, int64_t t) {
  const int64_t row = n / 8;
  const at::Tensor planes =
      strided(scratch, {g.outer, g.inner, t, 8, row, 1}, {g.outer_from, g.inner_from, 8 * row, row, 1, 1}, g.from);
  const at::TensorOptions bytes = at::TensorOptions().dtype(at::kByte).device(scratch.device());
  const at::Tensor shifts = at::arange(8, bytes);  // bit i % 8 of a plane's byte
  const at::Tensor weights = at::bitwise_left_shift(at::ones({8, 1}, bytes), shifts.view({8, 1}));  // bit k
  const at::Tensor bits =
      at::bitwise_and(at::bitwise_right_shift(planes, shifts), 1).reshape({g.outer, g.inner, t, 8, n});
  const at::Tensor elements = bits.mul(weights).sum({3}, false, at::kByte);  // (Q, L, t, n)
  strided(staging, {g.outer, g.inner, t, n}, {g.outer_to, g.inner_to, 1, t}, g.to).copy_(elements);
}

// Unshuffles the plan's blocks from scratch into staging, grouped by shape;
// bytes left as they are (no shuffle, the tails) become moves. Returns the operations launched.
int64_t unshuffle(const DecodePlan& plan, const at::Tensor& scratch, const at::Tensor& staging) {
  std::map<std::tuple<Shuffle, uint32_t, uint64_t>, std::vector<std::pair<uint64_t, uint64_t>>> groups;
  std::vector<ByteMove> as_they_are;
  for (const Unshuffle& step : plan.unshuffles) {
    groups[{step.kind, step.typesize, step.size}].emplace_back(step.scratch_offset, step.staging_offset);
  }
  int64_t operations = 0;
  for (const auto& [shape, blocks] : groups) {
    const auto [kind, typesize, size] = shape;
    const int64_t t = typesize, elements = t > 0 ? static_cast<int64_t>(size) / t : 0;
    const int64_t n = kind == Shuffle::kBit ? elements - elements % 8 : t > 1 ? elements : 0;
    const uint64_t body = kind == Shuffle::kNone ? 0 : static_cast<uint64_t>(n * t);
    if (body > 0) {
      for (const Grid& grid : grids_of(blocks)) {
        if (kind == Shuffle::kByte)
          byte_unshuffle(scratch, staging, grid, n, t);
        else
          bit_unshuffle(scratch, staging, grid, n, t);
        ++operations;
      }
    }
    if (body < size) {
      for (const auto& [from, to] : blocks) as_they_are.push_back(ByteMove{from + body, to + body, size - body});
    }
  }
  return operations + move_bytes(scratch, staging, as_they_are);
}

// The fill value in every fill chunk's staging bytes.
int64_t fill(const DecodePlan& plan, const at::Tensor& staging) {
  const auto item = static_cast<int64_t>(plan.item_size);
  const bool zero = std::all_of(plan.fill_value.begin(), plan.fill_value.end(), [](uint8_t b) { return b == 0; });
  at::Tensor value;
  int64_t operations = 0;
  for (const io::decode_plan::PlannedChunk& chunk : plan.chunks) {
    if (chunk.kind != ChunkKind::kFill || plan.chunk_bytes == 0) continue;
    at::Tensor bytes =
        staging.narrow(0, static_cast<int64_t>(chunk.staging_offset), static_cast<int64_t>(plan.chunk_bytes));
    if (zero) {
      bytes.zero_();
    } else {
      if (!value.defined()) {
        at::Tensor host = host_tensor(staging.device(), item, at::kByte);
        std::memcpy(host.data_ptr<uint8_t>(), plan.fill_value.data(), plan.item_size);
        value = upload(host, staging.device()).view({1, item});
      }
      bytes.view({-1, item}).copy_(value);
    }
    ++operations;
  }
  return operations;
}

// Chunks the device does not decode: decoded here, uploaded together, moved into staging.
int64_t host_chunks(const DecodePlan& plan, const at::Tensor& staging, DeviceDecodeStats& stats) {
  std::vector<uint32_t> chunks;
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    if (plan.chunks[c].kind == ChunkKind::kHost) chunks.push_back(static_cast<uint32_t>(c));
  }
  if (chunks.empty() || plan.chunk_bytes == 0) return 0;
  const c10::Device device = staging.device();
  if (device.is_cpu()) {
    for (uint32_t c : chunks) {
      io::decode_plan::decode_host_chunk(plan, c, staging.data_ptr<uint8_t>() + plan.chunks[c].staging_offset);
    }
    stats.host_chunks = static_cast<int64_t>(chunks.size());
    return 0;
  }
  at::Tensor host = host_tensor(device, static_cast<int64_t>(chunks.size() * plan.chunk_bytes), at::kByte);
  std::vector<ByteMove> moves;
  for (size_t i = 0; i < chunks.size(); ++i) {
    io::decode_plan::decode_host_chunk(plan, chunks[i], host.data_ptr<uint8_t>() + i * plan.chunk_bytes);
    moves.push_back(ByteMove{i * plan.chunk_bytes, plan.chunks[chunks[i]].staging_offset, plan.chunk_bytes});
  }
  stats.host_chunks = static_cast<int64_t>(chunks.size());
  stats.uploaded_bytes += host.numel();
  return move_bytes(upload(host, device), staging, moves);
}

void check_piece_bounds(const DecodePlan& plan, const Piece& piece, const at::Tensor& scratch,
                        const at::Tensor& staging) {
  const uint64_t room = static_cast<uint64_t>((piece.to_scratch ? scratch : staging).numel());
  plan.piece_input(piece);  // within its chunk's bytes, or logic_error
  if (piece.output_offset + piece.output_size > room) {
    throw std::logic_error(
        concat(io::decode_plan::chunk_where(plan, piece.chunk), ": a piece outside the plan's buffers"));
  }
}

// Runs task(0 .. count-1) on the pool's threads, or here without one.
void for_each(core::ThreadPool* pool, size_t count, const std::function<void(int64_t)>& task) {
  if (pool != nullptr && count > 1) {
    pool->parallel_for(static_cast<int64_t>(count), task);
  } else {
    for (size_t i = 0; i < count; ++i) task(static_cast<int64_t>(i));
  }
}

// The CPU's codecs, piece by piece, straight into scratch and staging (pieces write disjoint bytes).
void decompress_on_cpu(const DecodePlan& plan, const at::Tensor& scratch, const at::Tensor& staging,
                       core::ThreadPool* pool) {
  for (const Piece& piece : plan.pieces) check_piece_bounds(plan, piece, scratch, staging);
  uint8_t* const scratch_bytes = scratch.data_ptr<uint8_t>();
  uint8_t* const staging_bytes = staging.data_ptr<uint8_t>();
  for_each(pool, plan.pieces.size(), [&](int64_t i) {
    const Piece& piece = plan.pieces[static_cast<size_t>(i)];
    uint8_t* target = (piece.to_scratch ? scratch_bytes : staging_bytes) + piece.output_offset;
    io::decode_plan::decode_piece(plan, piece, plan.piece_input(piece), target);
  });
}

const NvcompDecompressor& decompressor_of(const NvcompLibrary& nvcomp, PieceCodec codec) {
  return codec == PieceCodec::kLz4 ? nvcomp.lz4 : codec == PieceCodec::kZstd ? nvcomp.zstd : nvcomp.deflate;
}

std::string nvcomp_status(const NvcompLibrary& nvcomp, int status) {
  const char* text = nvcomp.status_string ? nvcomp.status_string(status) : nullptr;
  return text ? concat(text, " (", status, ")") : concat("status ", status);
}

// The pieces decompressed by nvCOMP's batched decompressors (one call a
// codec), their compressed bytes uploaded in one copy, 16-byte aligned; a
// piece whose output is not aligned lands in an aligned buffer and is moved.
// The statuses and sizes are read back at the end of execute_plan (check()).
class NvcompPieces {
 public:
  NvcompPieces(const DecodePlan& plan, const NvcompLibrary& nvcomp, const at::Tensor& scratch,
               const at::Tensor& staging, DeviceDecodeStats& stats, core::ThreadPool* pool)
      : plan_(plan), nvcomp_(nvcomp), scratch_(scratch), staging_(staging), device_(staging.device()) {
    const std::vector<Piece>& pieces = plan.pieces;
    std::vector<uint64_t> packed(pieces.size());
    uint64_t input_bytes = 0, landing_bytes = 0;
    std::vector<uint64_t> landing(pieces.size(), ~uint64_t{0});
    for (size_t i = 0; i < pieces.size(); ++i) {
      check_piece_bounds(plan, pieces[i], scratch, staging);
      packed[i] = input_bytes;
      input_bytes += aligned(pieces[i].input_size);
      if (pieces[i].codec != PieceCodec::kCopy && pieces[i].output_offset % kAlign != 0) {
        landing[i] = landing_bytes;
        landing_bytes += aligned(pieces[i].output_size);
      }
    }
    at::Tensor host = host_tensor(device_, static_cast<int64_t>(input_bytes), at::kByte);
    uint8_t* const packing = host.data_ptr<uint8_t>();
    for_each(pool, pieces.size(), [&](int64_t i) {
      const Piece& piece = pieces[static_cast<size_t>(i)];
      std::memcpy(packing + packed[static_cast<size_t>(i)], plan.piece_input(piece), piece.input_size);
    });
    input_ = upload(host, device_);
    stats.uploaded_bytes += static_cast<int64_t>(input_bytes);
    if (landing_bytes > 0) landing_ = device_bytes(device_, landing_bytes);

    // Per codec: the pieces' compressed pointers and sizes, output sizes and pointers.
    std::vector<int64_t> arrays;
    for (PieceCodec codec : {PieceCodec::kLz4, PieceCodec::kZstd, PieceCodec::kDeflate}) {
      Batch batch;
      batch.codec = codec;
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (pieces[i].codec == codec) batch.pieces.push_back(i);
      }
      if (batch.pieces.empty()) continue;
      batch.first = static_cast<int64_t>(arrays.size());
      const auto address = [](const at::Tensor& t, uint64_t offset) {
        return static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr<uint8_t>() + offset));
      };
      for (size_t i : batch.pieces) arrays.push_back(address(input_, packed[i]));
      for (size_t i : batch.pieces) arrays.push_back(static_cast<int64_t>(pieces[i].input_size));
      for (size_t i : batch.pieces) {
        arrays.push_back(static_cast<int64_t>(pieces[i].output_size));
        batch.max_output = std::max<uint64_t>(batch.max_output, pieces[i].output_size);
        batch.total_output += pieces[i].output_size;
      }
      for (size_t i : batch.pieces) {
        const Piece& piece = pieces[i];
        arrays.push_back(landing[i] != ~uint64_t{0}
                             ? address(landing_, landing[i])
                             : address(piece.to_scratch ? scratch : staging, piece.output_offset));
      }
      batches_.push_back(std::move(batch));
    }
    // Stored pieces and landed ones: moves.
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& piece = pieces[i];
      std::vector<ByteMove>& moves = piece.to_scratch ? to_scratch_ : to_staging_;
      if (piece.codec == PieceCodec::kCopy) {
        if (piece.input_size != piece.output_size) {
          throw core::ReadError(concat(io::decode_plan::chunk_where(plan, piece.chunk), ": a stored piece of ",
                                       piece.input_size, " bytes for ", piece.output_size));
        }
        copies_.push_back(ByteMove{packed[i], piece.output_offset, piece.output_size});
        copy_to_scratch_.push_back(piece.to_scratch);
      } else if (landing[i] != ~uint64_t{0}) {
        moves.push_back(ByteMove{landing[i], piece.output_offset, piece.output_size});
      }
    }
    stats.pieces += static_cast<int64_t>(pieces.size());
    if (batches_.empty()) return;
    arrays_ = upload_longs(arrays, device_);
    const at::TensorOptions on_device = at::TensorOptions().device(device_);
    actual_ = at::empty({static_cast<int64_t>(arrays.size() / 4)}, on_device.dtype(at::kLong));
    statuses_ = at::zeros({static_cast<int64_t>(arrays.size() / 4)}, on_device.dtype(at::kInt));
  }

  // Enqueues the decompressions and the moves of stored and landed pieces.
  int64_t run() {
    int64_t operations = 0;
    const c10::Stream stream = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
    void* const cuda_stream = stream.native_handle();
    int64_t done = 0;
    for (const Batch& batch : batches_) {
      const auto count = static_cast<int64_t>(batch.pieces.size());
      const auto at = [&](int64_t array) { return arrays_.data_ptr<int64_t>() + batch.first + array * count; };
      const NvcompDecompressor& functions = decompressor_of(nvcomp_, batch.codec);
      size_t temp_bytes = 0;
      int status = 0;
      if (nvcomp_.with_options()) {
        status = reinterpret_cast<NvcompDecompressTempSize>(functions.temp_size)(
            static_cast<size_t>(count), batch.max_output, NvcompDecompressOptions{}, &temp_bytes, batch.total_output,
            cuda_stream);
      } else {
        status = reinterpret_cast<NvcompDecompressTempSizeV4>(functions.temp_size)(
            static_cast<size_t>(count), batch.max_output, &temp_bytes, batch.total_output);
      }
      check_launch(status, batch, "the temporary memory size");
      const at::Tensor temp = device_bytes(device_, std::max<size_t>(temp_bytes, 1));
      const auto pointers = [](int64_t* p) { return reinterpret_cast<const void* const*>(p); };
      const auto sizes = [](int64_t* p) { return reinterpret_cast<const size_t*>(p); };
      size_t* actual = reinterpret_cast<size_t*>(actual_.data_ptr<int64_t>() + done);
      int* statuses = statuses_.data_ptr<int>() + done;
      if (nvcomp_.with_options()) {
        status = reinterpret_cast<NvcompDecompressAsync>(functions.decompress_async)(
            pointers(at(0)), sizes(at(1)), sizes(at(2)), actual, static_cast<size_t>(count), temp.data_ptr(),
            temp_bytes, reinterpret_cast<void* const*>(at(3)), NvcompDecompressOptions{}, statuses, cuda_stream);
      } else {
        status = reinterpret_cast<NvcompDecompressAsyncV4>(functions.decompress_async)(
            pointers(at(0)), sizes(at(1)), sizes(at(2)), actual, static_cast<size_t>(count), temp.data_ptr(),
            temp_bytes, reinterpret_cast<void* const*>(at(3)), statuses, cuda_stream);
      }
      check_launch(status, batch, "the decompression");
      done += count;
      ++operations;
    }
    std::vector<ByteMove> stored_to_scratch, stored_to_staging;
    for (size_t i = 0; i < copies_.size(); ++i) {
      (copy_to_scratch_[i] ? stored_to_scratch : stored_to_staging).push_back(copies_[i]);
    }
    operations += move_bytes(input_, scratch_, stored_to_scratch) + move_bytes(input_, staging_, stored_to_staging);
    if (landing_.defined()) {
      operations += move_bytes(landing_, scratch_, to_scratch_) + move_bytes(landing_, staging_, to_staging_);
    }
    return operations;
  }

  // Reads the statuses and sizes back (waits for the device): a piece that
  // did not decompress to its size is an error naming its chunk.
  void check() const {
    if (batches_.empty()) return;
    // Read back into pinned memory, then waited for by polling an event: a synchronizing copy spins a
    // core for as long as the GPU works, and several readers wait at once.
    const at::Tensor statuses = host_tensor(device_, statuses_.numel(), at::kInt);
    const at::Tensor actual = host_tensor(device_, actual_.numel(), at::kLong);
    statuses.copy_(statuses_, /*non_blocking=*/true);
    actual.copy_(actual_, /*non_blocking=*/true);
    c10::Event read_back(device_.type());
    read_back.record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
    while (!read_back.query()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    int64_t k = 0;
    for (const Batch& batch : batches_) {
      for (size_t i : batch.pieces) {
        const Piece& piece = plan_.pieces[i];
        const int status = statuses.data_ptr<int>()[k];
        const auto got = static_cast<uint64_t>(actual.data_ptr<int64_t>()[k++]);
        if (status != 0 || got != piece.output_size) {
          throw core::ReadError(concat(io::decode_plan::chunk_where(plan_, piece.chunk), ": nvCOMP's ",
                                       io::decode_plan::piece_codec_name(piece.codec), " piece of ", piece.input_size,
                                       " bytes did not decode to ", piece.output_size, " bytes (",
                                       status != 0 ? nvcomp_status(nvcomp_, status) : concat(got, " bytes"), ")"));
        }
      }
    }
  }

 private:
  struct Batch {
    PieceCodec codec;
    std::vector<size_t> pieces;
    int64_t first = 0;  // in the arrays: compressed pointers, compressed sizes, output sizes, output pointers
    uint64_t max_output = 0, total_output = 0;
  };

  void check_launch(int status, const Batch& batch, const char* what) const {
    if (status == 0) return;
    const Piece& first = plan_.pieces[batch.pieces.front()];
    throw core::ReadError(concat(io::decode_plan::chunk_where(plan_, first.chunk), ": nvCOMP refused ", what, " of ",
                                 batch.pieces.size(), " ", io::decode_plan::piece_codec_name(batch.codec),
                                 " pieces: ", nvcomp_status(nvcomp_, status)));
  }

  const DecodePlan& plan_;
  const NvcompLibrary& nvcomp_;
  at::Tensor scratch_, staging_;
  c10::Device device_;
  at::Tensor input_, landing_, arrays_, actual_, statuses_;
  std::vector<Batch> batches_;
  std::vector<ByteMove> copies_;  // stored pieces: input to their place
  std::vector<bool> copy_to_scratch_;
  std::vector<ByteMove> to_scratch_, to_staging_;  // landed pieces
};

}  // namespace

int64_t move_bytes(const at::Tensor& src, const at::Tensor& dst, const std::vector<ByteMove>& moves) {
  if (moves.empty()) return 0;
  constexpr size_t kOneByOne = 8;
  if (moves.size() <= kOneByOne) {
    for (const ByteMove& m : moves) {
      const auto size = static_cast<int64_t>(m.size);
      dst.narrow(0, static_cast<int64_t>(m.to), size).copy_(src.narrow(0, static_cast<int64_t>(m.from), size));
    }
    return static_cast<int64_t>(moves.size());
  }
  // The widest unit every offset, size and base address allows.
  uint64_t unit = 8;
  const auto base = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); };
  for (const ByteMove& m : moves) {
    while ((m.from | m.to | m.size) % unit != 0) unit /= 2;
  }
  while ((base(src) | base(dst)) % unit != 0) unit /= 2;
  const at::ScalarType type = unit == 8 ? at::kLong : unit == 4 ? at::kInt : unit == 2 ? at::kShort : at::kByte;
  const auto words = [&](const at::Tensor& bytes) {
    return bytes.narrow(0, 0, bytes.numel() / static_cast<int64_t>(unit) * static_cast<int64_t>(unit)).view(type);
  };
  const at::Tensor from_words = words(src), to_words = words(dst);
  const c10::Device device = dst.device();
  const auto n = static_cast<int64_t>(moves.size());
  const bool same_size =
      std::all_of(moves.begin(), moves.end(), [&](const ByteMove& m) { return m.size == moves[0].size; });
  std::vector<int64_t> table;
  table.reserve(moves.size() * 3);
  for (const ByteMove& m : moves) table.push_back(static_cast<int64_t>(m.from / unit));
  for (const ByteMove& m : moves) table.push_back(static_cast<int64_t>(m.to / unit));
  for (const ByteMove& m : moves) table.push_back(static_cast<int64_t>(m.size / unit));
  const at::Tensor starts = upload_longs(table, device).view({3, n});
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor from_index, to_index;
  if (same_size) {  // every move the same length: a 2-D index, no searching
    const at::Tensor within = at::arange(static_cast<int64_t>(moves[0].size / unit), longs);
    from_index = (starts[0].unsqueeze(1) + within).reshape({-1});
    to_index = (starts[1].unsqueeze(1) + within).reshape({-1});
  } else {
    int64_t total = 0;
    for (const ByteMove& m : moves) total += static_cast<int64_t>(m.size / unit);
    const at::Tensor counts = starts[2];
    const at::Tensor move_of = at::repeat_interleave(counts, std::optional<int64_t>(total));  // each unit's move
    const at::Tensor first = at::cumsum(counts, 0) - counts;                                  // each move's first unit
    const at::Tensor within = at::arange(total, longs) - first.index_select(0, move_of);
    from_index = starts[0].index_select(0, move_of) + within;
    to_index = starts[1].index_select(0, move_of) + within;
  }
  to_words.index_copy_(0, to_index, from_words.index_select(0, from_index));
  return 1;
}

DeviceDecodeStats execute_plan(const DecodePlan& plan, const at::Tensor& out, const NvcompLibrary* nvcomp,
                               core::ThreadPool* pool) {
  const c10::Device device = out.device();
  TORCH_CHECK(out.scalar_type() == at::kByte && out.dim() == 1 && out.is_contiguous() &&
                  static_cast<uint64_t>(out.numel()) >= plan.output_bytes,
              "execute_plan: out must be a contiguous 1-D uint8 tensor of at least ", plan.output_bytes, " bytes");
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "execute_plan: ", device.str(), " is neither the CPU nor CUDA");
  TORCH_CHECK(device.is_cpu() || nvcomp != nullptr, "execute_plan: decoding on ", device.str(), " needs nvCOMP");
  const c10::DeviceGuard on_device(device);
  DeviceDecodeStats stats;
  const auto began = std::chrono::steady_clock::now();
  const at::Tensor staging = device_bytes(device, aligned(plan.staging_bytes));
  const at::Tensor scratch = device_bytes(device, aligned(plan.scratch_bytes));
  int64_t operations = fill(plan, staging);
  std::optional<NvcompPieces> pieces;
  if (device.is_cpu()) {
    decompress_on_cpu(plan, scratch, staging, pool);
    stats.pieces = static_cast<int64_t>(plan.pieces.size());
  } else {
    pieces.emplace(plan, *nvcomp, scratch, staging, stats, pool);
    stats.prepare_us = core::microseconds_since(began);
    operations += pieces->run();
  }
  operations += unshuffle(plan, scratch, staging);
  operations += host_chunks(plan, staging, stats);
  // The post-steps on the staged chunks (every byte the copies read; the same bytes come out).
  if (plan.byteswap_unit > 1 && plan.staging_bytes > 0) {
    const at::Tensor units = staging.narrow(0, 0, static_cast<int64_t>(plan.staging_bytes))
                                 .view({-1, static_cast<int64_t>(plan.byteswap_unit)});
    units.copy_(units.flip({1}));
    ++operations;
  }
  if (plan.booleans && plan.staging_bytes > 0) {
    const at::Tensor bytes = staging.narrow(0, 0, static_cast<int64_t>(plan.staging_bytes));
    bytes.copy_(bytes.ne(0));
    ++operations;
  }
  std::vector<ByteMove> rows;
  rows.reserve(plan.copies.size());
  for (const io::decode_plan::Copy& copy : plan.copies) {
    rows.push_back(ByteMove{copy.staging_offset, copy.output_offset, copy.size});
  }
  operations += move_bytes(staging, out, rows);
  stats.operations += operations;
  stats.enqueue_us = core::microseconds_since(began) - stats.prepare_us;
  const auto waited = std::chrono::steady_clock::now();
  if (pieces) pieces->check();
  stats.wait_us = core::microseconds_since(waited);
  return stats;
}

}  // namespace torch_shards
