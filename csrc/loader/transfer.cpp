#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/transfer.h"

#include <ATen/ops/_sparse_csr_tensor_unsafe.h>
#include <ATen/ops/empty.h>

#include <atomic>
#include <unordered_map>

#include "core/errors.h"
#include "loader/buffer_pool.h"

namespace torch_shards {
namespace {

constexpr int64_t kVersion = 1;
constexpr int64_t kDense = 0;
constexpr int64_t kSparseCsr = 1;

std::atomic_ref<int64_t> lease_word(const c10::Storage& storage) {
  return std::atomic_ref<int64_t>(*static_cast<int64_t*>(storage.mutable_data()));
}

// A view of a rebuilt storage that gives its lease back when the last tensor viewing it goes.
struct Lease {
  c10::Storage storage;
};

void release(void* context) {
  auto* lease = static_cast<Lease*>(context);
  lease_word(lease->storage).fetch_sub(1, std::memory_order_acq_rel);
  delete lease;
}

c10::Storage leased_alias(const c10::Storage& storage) {
  void* data = storage.mutable_data();
  const size_t bytes = storage.nbytes();
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes,
                      c10::DataPtr(data, new Lease{storage}, &release, c10::Device(c10::DeviceType::CPU)),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

class Writer {
 public:
  Writer(const BufferPool* pool) : pool_(pool) {}

  void tensor(const at::Tensor& tensor) {
    const c10::Storage& storage = tensor.storage();
    auto [it, added] = index_.emplace(storage.unsafeGetStorageImpl(), static_cast<int64_t>(storages_.size()));
    if (added) storages_.push_back(storage);
    words_.push_back(it->second);
    words_.push_back(static_cast<int64_t>(tensor.scalar_type()));
    words_.push_back(tensor.storage_offset());
    words_.push_back(tensor.dim());
    for (int64_t size : tensor.sizes()) words_.push_back(size);
    for (int64_t stride : tensor.strides()) words_.push_back(stride);
  }

  void field(int64_t name, const at::Tensor& tensor) {
    core::check_argument(tensor.device().is_cpu(), "pack: field tensors must be on the CPU");
    words_.push_back(name);
    if (tensor.layout() == at::kSparseCsr) {
      words_.push_back(kSparseCsr);
      words_.push_back(tensor.size(0));
      words_.push_back(tensor.size(1));
      this->tensor(tensor.crow_indices());
      this->tensor(tensor.col_indices());
      this->tensor(tensor.values());
      return;
    }
    core::check_argument(tensor.layout() == at::kStrided, "pack: unsupported tensor layout ", tensor.layout());
    words_.push_back(kDense);
    this->tensor(tensor);
  }

  std::vector<int64_t>& words() { return words_; }

  // The storages as uint8 tensors, with one lease taken on each the pool recycles in shared memory.
  std::pair<std::vector<at::Tensor>, std::vector<int64_t>> storages() const {
    std::vector<at::Tensor> out;
    std::vector<int64_t> leased;
    for (const c10::Storage& storage : storages_) {
      const bool lease = pool_ != nullptr && pool_->recycles_shared(storage);
      if (lease) lease_word(storage).fetch_add(1, std::memory_order_acq_rel);
      leased.push_back(lease);
      at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte));
      bytes.set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
      out.push_back(std::move(bytes));
    }
    return {std::move(out), std::move(leased)};
  }

 private:
  const BufferPool* pool_;
  std::unordered_map<const c10::StorageImpl*, int64_t> index_;
  std::vector<c10::Storage> storages_;
  std::vector<int64_t> words_;
};

class Reader {
 public:
  Reader(const at::Tensor& description) : description_(description.contiguous()) {
    core::check_argument(description_.scalar_type() == at::kLong && description_.dim() == 1,
                         "unpack: the description must be a 1-D int64 tensor");
    words_ = description_.const_data_ptr<int64_t>();
    size_ = description_.numel();
  }

  int64_t next() {
    core::check_argument(position_ < size_, "unpack: the description ends early");
    return words_[position_++];
  }
  bool done() const { return position_ == size_; }

  at::Tensor tensor(const std::vector<c10::Storage>& storages) {
    const int64_t index = next();
    core::check_argument(index >= 0 && index < static_cast<int64_t>(storages.size()), "unpack: storage ", index,
                         " out of range");
    const int64_t code = next();
    core::check_argument(code >= 0 && code < static_cast<int64_t>(c10::ScalarType::NumOptions),
                         "unpack: unknown dtype code ", code);
    const auto dtype = static_cast<c10::ScalarType>(code);
    const int64_t offset = next(), dim = next();
    core::check_argument(offset >= 0 && dim >= 0 && dim <= 64, "unpack: bad offset ", offset, " or dimensions ", dim);
    std::vector<int64_t> sizes(dim), strides(dim);
    for (int64_t& size : sizes) size = next();
    for (int64_t& stride : strides) stride = next();
    // The farthest element must lie inside the storage.
    const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
    int64_t last = offset, count = 1;
    for (int64_t d = 0; d < dim; ++d) {
      core::check_argument(sizes[d] >= 0 && strides[d] >= 0, "unpack: bad size or stride");
      count *= sizes[d];
      if (sizes[d] > 0) last += (sizes[d] - 1) * strides[d];
    }
    const c10::Storage& storage = storages[index];
    core::check_argument(count == 0 || (last + 1) * element <= static_cast<int64_t>(storage.nbytes()),
                         "unpack: a tensor reaches past its storage's ", storage.nbytes(), " bytes");
    at::Tensor out = at::empty({0}, at::TensorOptions().dtype(dtype));
    out.set_(storage, offset, sizes, strides);
    return out;
  }

 private:
  at::Tensor description_;
  const int64_t* words_ = nullptr;
  int64_t size_ = 0, position_ = 0;
};

}  // namespace

int64_t leases(const c10::Storage& storage) { return lease_word(storage).load(std::memory_order_acquire); }

Packed pack(const std::vector<sources::Batch>& batches, const BufferPool* pool, int64_t worker,
            const std::vector<int64_t>& worker_batches) {
  Writer writer(pool);
  std::vector<std::string> names;
  std::unordered_map<std::string, int64_t> name_index;
  for (const sources::Batch& batch : batches) {
    writer.words().push_back(static_cast<int64_t>(batch.size()));
    for (const auto& item : batch) {
      auto [it, added] = name_index.emplace(item.key(), static_cast<int64_t>(names.size()));
      if (added) names.push_back(item.key());
      writer.field(it->second, item.value());
    }
  }
  auto [storages, leased] = writer.storages();
  std::vector<int64_t> words{kVersion, static_cast<int64_t>(storages.size()), static_cast<int64_t>(batches.size()),
                             worker, static_cast<int64_t>(worker_batches.size())};
  words.insert(words.end(), worker_batches.begin(), worker_batches.end());
  words.insert(words.end(), leased.begin(), leased.end());
  words.insert(words.end(), writer.words().begin(), writer.words().end());
  at::Tensor description = at::empty({static_cast<int64_t>(words.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(words.begin(), words.end(), description.mutable_data_ptr<int64_t>());
  return Packed{std::move(storages), std::move(description), std::move(names)};
}

std::tuple<std::vector<sources::Batch>, int64_t, std::vector<int64_t>> unpack(const std::vector<at::Tensor>& storages,
                                                                              const at::Tensor& description,
                                                                              const std::vector<std::string>& names) {
  Reader reader(description);
  core::check_argument(reader.next() == kVersion, "unpack: the description comes from another torch_shards version");
  const int64_t num_storages = reader.next(), num_batches = reader.next(), worker = reader.next();
  core::check_argument(num_storages == static_cast<int64_t>(storages.size()), "unpack: the description names ",
                       num_storages, " storages, got ", storages.size());
  const int64_t num_workers = reader.next();
  core::check_argument(num_batches >= 0 && num_workers >= 0 && num_workers <= (int64_t{1} << 20),
                       "unpack: bad batch or worker count");
  std::vector<int64_t> worker_batches(static_cast<size_t>(num_workers));
  for (int64_t& count : worker_batches) count = reader.next();
  std::vector<c10::Storage> views;
  for (const at::Tensor& bytes : storages) {
    core::check_argument(bytes.device().is_cpu() && bytes.scalar_type() == at::kByte,
                         "unpack: storages must be CPU uint8 tensors");
    const c10::Storage& storage = bytes.storage();
    const bool leased = reader.next() != 0;
    core::check_argument(!leased || storage.nbytes() >= kLeaseHeaderBytes, "unpack: a leased storage is too small");
    views.push_back(leased ? leased_alias(storage) : storage);
  }
  std::vector<sources::Batch> batches;
  for (int64_t b = 0; b < num_batches; ++b) {
    sources::Batch batch;
    const int64_t fields = reader.next();
    for (int64_t f = 0; f < fields; ++f) {
      const int64_t name = reader.next();
      core::check_argument(name >= 0 && name < static_cast<int64_t>(names.size()), "unpack: field name ", name,
                           " out of range");
      const int64_t kind = reader.next();
      if (kind == kDense) {
        batch.insert(names[name], reader.tensor(views));
        continue;
      }
      core::check_argument(kind == kSparseCsr, "unpack: unknown field kind ", kind);
      const int64_t rows = reader.next(), columns = reader.next();
      at::Tensor offsets = reader.tensor(views), indices = reader.tensor(views), values = reader.tensor(views);
      batch.insert(names[name], at::_sparse_csr_tensor_unsafe(offsets, indices, values, {rows, columns},
                                                              values.options().layout(at::kSparseCsr)));
    }
    batches.push_back(std::move(batch));
  }
  core::check_argument(reader.done(), "unpack: the description has words left over");
  return {std::move(batches), worker, std::move(worker_batches)};
}

}  // namespace torch_shards
