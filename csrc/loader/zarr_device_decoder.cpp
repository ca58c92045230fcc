#include "loader/zarr_device_decoder.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/errors.h"
#include "core/stopwatch.h"
#include "io/anndata.h"
#include "io/array.h"
#include "io/zarr/group.h"
#include "loader/sources/array_tensors.h"

namespace torch_shards {

using core::concat;
using io::decode_plan::DecodePlan;
using io::decode_plan::DecodePlanner;

namespace {

// "a/b" from "/a/b/", "" for the root.
std::string trimmed(const std::string& path) {
  const size_t first = path.find_first_not_of('/');
  if (first == std::string::npos) return "";
  return path.substr(first, path.find_last_not_of('/') - first + 1);
}

std::vector<int64_t> shape_of(const nlohmann::json& attributes, const std::string& where) {
  const auto shape = attributes.find("shape");
  if (shape == attributes.end() || !shape->is_array() || shape->size() != 2 || !(*shape)[0].is_number_integer() ||
      !(*shape)[1].is_number_integer() || (*shape)[0].get<int64_t>() < 0 || (*shape)[1].get<int64_t>() < 0) {
    throw core::ReadError(concat(where, ": a csr_matrix group needs a 'shape' attribute of two sizes"));
  }
  return {(*shape)[0].get<int64_t>(), (*shape)[1].get<int64_t>()};
}

}  // namespace

ZarrDeviceDecoderImpl::ZarrDeviceDecoderImpl(const std::string& store, const std::string& path,
                                             std::vector<std::string> nvcomp_dirs, int64_t num_threads,
                                             bool trust_unverified)
    : where_(store + ":/" + trimmed(path)), nvcomp_dirs_(std::move(nvcomp_dirs)) {
  TORCH_CHECK_VALUE(num_threads >= 1, "ZarrDeviceDecoder: num_threads must be >= 1, got ", num_threads);
  pool_ = std::make_unique<core::ThreadPool>(static_cast<size_t>(num_threads));
  const std::string node = trimmed(path);
  const size_t slash = node.rfind('/');
  const std::string parent = slash == std::string::npos ? "/" : "/" + node.substr(0, slash);
  const std::string name = slash == std::string::npos ? node : node.substr(slash + 1);
  std::shared_ptr<const io::Group> group;
  if (!name.empty()) {
    const std::shared_ptr<const io::Group> above = io::open_zarr_group(store, parent);
    if (above->has_group(name)) group = above->group(name);
  }
  if (!group) {
    dense_.emplace(DecodePlanner::open(store, "/" + node));
    dense_->trust_unverified(trust_unverified);
    return;
  }
  const nlohmann::json attributes = group->attributes();
  const auto encoding = attributes.find("encoding-type");
  if (encoding == attributes.end() || *encoding != "csr_matrix") {
    throw core::InvalidArgument(concat(where_, ": a group, not an array or a CSR matrix (encoding-type '",
                                       encoding == attributes.end() ? "" : encoding->dump(), "')"));
  }
  const std::vector<int64_t> shape = shape_of(attributes, where_);
  csr_ = std::make_shared<io::CsrMatrix>(io::cached_indptr(group->array("indptr")), group->array("indices"),
                                         group->array("data"), shape[0], shape[1]);
  indices_.emplace(DecodePlanner::open(store, "/" + node + "/indices"));
  values_.emplace(DecodePlanner::open(store, "/" + node + "/data"));
  indices_->trust_unverified(trust_unverified);
  values_->trust_unverified(trust_unverified);
}

const io::decode_plan::NvcompLibrary* ZarrDeviceDecoderImpl::nvcomp_for(const c10::Device& device) {
  if (!device.is_cuda()) return nullptr;
  if (!nvcomp_) nvcomp_ = io::decode_plan::load_nvcomp(nvcomp_dirs_);
  return &*nvcomp_;
}

std::string ZarrDeviceDecoderImpl::nvcomp_library() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return nvcomp_ ? concat(nvcomp_->location, " (version ", nvcomp_->version, ")") : "";
}

std::string ZarrDeviceDecoderImpl::host_reason() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return host_reason_;
}

std::string ZarrDeviceDecoderImpl::fallback_reason() const {
  if (dense_) return dense_->array_fallback();
  return !values_->array_fallback().empty() ? values_->array_fallback() : indices_->array_fallback();
}

at::Tensor ZarrDeviceDecoderImpl::decode(const DecodePlan& plan, at::ScalarType type, const c10::Device& device) {
  const auto item = static_cast<uint64_t>(c10::elementSize(type));
  const at::Tensor out = at::empty({static_cast<int64_t>((plan.output_bytes + item - 1) / item)},
                                   at::TensorOptions().dtype(type).device(device));
  if (plan.output_bytes > 0) {
    const DeviceDecodeStats done =
        execute_plan(plan, out.view(at::kByte).narrow(0, 0, static_cast<int64_t>(plan.output_bytes)),
                     nvcomp_for(device), pool_.get());
    stats_.pieces += done.pieces;
    stats_.uploaded_bytes += done.uploaded_bytes;
    stats_.operations += done.operations;
    stats_.host_chunks += done.host_chunks;
    stats_.prepare_us += done.prepare_us;
    stats_.enqueue_us += done.enqueue_us;
    stats_.wait_us += done.wait_us;
  }
  chunks_ += static_cast<int64_t>(plan.chunks.size());
  if (host_reason_.empty()) host_reason_ = plan.fallback_reason();
  input_bytes_ += static_cast<int64_t>(plan.input_bytes());
  fetch_us_ += plan.fetch_us;
  check_us_ += plan.check_us;
  return out;
}

at::Tensor ZarrDeviceDecoderImpl::read_dense(const std::vector<int64_t>& rows, const c10::Device& device) {
  const auto began = std::chrono::steady_clock::now();
  const DecodePlan plan = dense_->plan(io::segments_in_delivery_order(rows), *pool_);
  plan_us_ = core::microseconds_since(began);
  std::vector<int64_t> shape{static_cast<int64_t>(rows.size())};
  const std::vector<int64_t>& array_shape = dense_->metadata().shape;
  shape.insert(shape.end(), array_shape.begin() + 1, array_shape.end());
  return decode(plan, sources::to_scalar_type(dense_->metadata().dtype), device).view(shape);
}

ZarrDeviceDecoderImpl::Read ZarrDeviceDecoderImpl::read_csr(const std::vector<int64_t>& rows,
                                                            const c10::Device& device) {
  const auto began = std::chrono::steady_clock::now();
  io::CsrPlan csr = csr_->plan(rows, *pool_);
  const DecodePlan indices_plan = indices_->plan(csr.segments, *pool_);
  const DecodePlan values_plan = values_->plan(csr.segments, *pool_);
  plan_us_ = core::microseconds_since(began);
  const at::Tensor values = decode(values_plan, sources::to_scalar_type(values_->metadata().dtype), device);
  const at::Tensor stored = decode(indices_plan, sources::to_scalar_type(indices_->metadata().dtype), device);
  const int64_t columns = csr_->num_cols();
  // A column index outside the matrix would make an invalid tensor: checked on the device, read back once.
  if (stored.numel() > 0 && stored.lt(0).logical_or(stored.ge(columns)).any().item<bool>()) {
    throw core::ReadError(concat(where_, "/indices: a column index outside [0, ", columns, ")"));
  }
  const bool narrow = stored.scalar_type() != at::kLong && csr.nnz() <= std::numeric_limits<int32_t>::max() &&
                      columns <= std::numeric_limits<int32_t>::max();
  const at::ScalarType index_type = narrow ? at::kInt : at::kLong;
  at::Tensor offsets = at::empty({static_cast<int64_t>(csr.row_offsets.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(csr.row_offsets.begin(), csr.row_offsets.end(), offsets.data_ptr<int64_t>());
  at::Tensor out =
      at::sparse_csr_tensor(offsets.to(index_type).to(device), stored.to(index_type), values,
                            {static_cast<int64_t>(rows.size()), columns}, values.options().layout(at::kSparseCsr));
  return Read{std::move(out), std::move(csr.row_offsets)};
}

std::vector<int64_t> ZarrDeviceDecoderImpl::checked_rows(const at::Tensor& rows, const char* who) {
  TORCH_CHECK_VALUE(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.device().is_cpu(), "ZarrDeviceDecoder.",
                    who, ": rows must be a 1-D int64 CPU tensor, got ", rows.scalar_type(), " of ", rows.dim(),
                    " dimensions on ", rows.device().str());
  const at::Tensor wanted = rows.contiguous();
  return std::vector<int64_t>(wanted.data_ptr<int64_t>(), wanted.data_ptr<int64_t>() + wanted.numel());
}

ZarrDeviceDecoderImpl::Read ZarrDeviceDecoderImpl::read_on(const std::vector<int64_t>& rows, const std::string& device,
                                                           const char* who) {
  const c10::Device target(device);
  TORCH_CHECK_VALUE(target.is_cpu() || target.is_cuda(), "ZarrDeviceDecoder.", who,
                    ": device must be 'cpu' or 'cuda[:N]', got '", device, "'");
  TORCH_CHECK_VALUE(!target.is_cuda() || at::hasCUDA(), "ZarrDeviceDecoder.", who, ": device='", device,
                    "' but this torch has no CUDA device (torch.cuda.is_available() is False)");
  const std::lock_guard<std::mutex> lock(mutex_);
  stats_ = DeviceDecodeStats{};
  chunks_ = input_bytes_ = plan_us_ = fetch_us_ = check_us_ = 0;
  host_reason_.clear();
  if (!target.is_cuda()) return dense_ ? Read{read_dense(rows, target), {}} : read_csr(rows, target);
  const c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
  const c10::Device gpu(c10::DeviceType::CUDA, target.has_index() ? target.index() : cuda.getDevice().index());
  const c10::Stream caller = cuda.getStream(gpu);
  if (!stream_ || stream_->device() != gpu) stream_ = cuda.getStreamFromGlobalPool(gpu, false);
  Read done;
  {
    const c10::StreamGuard on_own_stream(*stream_);
    done = dense_ ? Read{read_dense(rows, gpu), {}} : read_csr(rows, gpu);
  }
  // The caller's stream waits for the decoder's (no host wait: a read of an uncompressed array has
  // nothing to read back), and the memory is the caller's stream's to free.
  c10::Event decoded(c10::DeviceType::CUDA);
  decoded.record(*stream_);
  decoded.block(caller);
  const at::Tensor& out = done.out;
  const std::vector<at::Tensor> parts =
      out.layout() == at::kSparseCsr ? std::vector<at::Tensor>{out.crow_indices(), out.col_indices(), out.values()}
                                     : std::vector<at::Tensor>{out};
  for (const at::Tensor& part : parts) {
    if (part.numel() > 0) part.record_stream(caller);
  }
  return done;
}

at::Tensor ZarrDeviceDecoderImpl::read(const at::Tensor& rows, const std::string& device) {
  return read_on(checked_rows(rows, "read"), device, "read").out;
}

std::vector<at::Tensor> ZarrDeviceDecoderImpl::read_batches(const std::vector<at::Tensor>& batches,
                                                            const std::string& device) {
  std::vector<int64_t> rows, lengths;
  for (const at::Tensor& batch : batches) {
    const std::vector<int64_t> some = checked_rows(batch, "read_batches");
    rows.insert(rows.end(), some.begin(), some.end());
    lengths.push_back(static_cast<int64_t>(some.size()));
  }
  const Read done = read_on(rows, device, "read_batches");
  std::vector<at::Tensor> out;
  out.reserve(lengths.size());
  int64_t first = 0;
  for (const int64_t length : lengths) {
    if (done.out.layout() != at::kSparseCsr) {
      out.push_back(done.out.narrow(0, first, length));
    } else {
      // Rows [first, first + length): their row pointer rebased, their indices and values viewed.
      const int64_t begin = done.row_offsets[first], end = done.row_offsets[first + length];
      const at::Tensor crow = done.out.crow_indices().narrow(0, first, length + 1);
      out.push_back(at::sparse_csr_tensor(crow - begin, done.out.col_indices().narrow(0, begin, end - begin),
                                          done.out.values().narrow(0, begin, end - begin), {length, done.out.size(1)},
                                          done.out.values().options().layout(at::kSparseCsr)));
    }
    first += length;
  }
  return out;
}

c10::Dict<std::string, int64_t> ZarrDeviceDecoderImpl::stats() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  c10::Dict<std::string, int64_t> out;
  out.insert("pieces", stats_.pieces);
  out.insert("uploaded_bytes", stats_.uploaded_bytes);
  out.insert("operations", stats_.operations);
  out.insert("host_chunks", stats_.host_chunks);
  out.insert("chunks", chunks_);
  out.insert("input_bytes", input_bytes_);
  out.insert("plan_us", plan_us_);
  out.insert("fetch_us", fetch_us_);
  out.insert("check_us", check_us_);
  out.insert("prepare_us", stats_.prepare_us);
  out.insert("enqueue_us", stats_.enqueue_us);
  out.insert("wait_us", stats_.wait_us);
  return out;
}

}  // namespace torch_shards
