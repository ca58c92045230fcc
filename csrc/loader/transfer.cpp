#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/transfer.h"

#include <ATen/ops/_sparse_csr_tensor_unsafe.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "core/errors.h"
#include "loader/batches.h"
#include "loader/errors.h"

namespace torch_shards {
namespace {

// The description's layout (int64 words):
//   version, owner pid, owner nonce, last, freed count, freed slab ids...,
//   slab count, per slab: id, fd, inode, bytes,
//   other storage count, unit count, worker, worker count, worker_batches...,
//   per unit: batch size (0: one batch, uncut), field count, per field: name index, kind, then
//     dense: a tensor record; CSR: rows, columns, and records of crow_indices, col_indices, values;
//     then offset count, per offset (split_into_batches' offsets of a CSR field): name index, a tensor record.
//   A tensor record: storage index (slabs first, then others), dtype, offset, dim, sizes..., strides...
constexpr int64_t kVersion = 3;
constexpr int64_t kDense = 0;
constexpr int64_t kSparseCsr = 1;
constexpr int64_t kMaxCount =
    int64_t{1} << 24;  // of slabs, storages, batches, workers, freed ids: far above any real one

std::atomic_ref<int64_t> lease_word(const c10::Storage& slab) {
  return std::atomic_ref<int64_t>(*static_cast<int64_t*>(slab.mutable_data()));
}

// A view of a mapped slab that gives its lease back when the last tensor viewing it goes.
struct Lease {
  c10::Storage slab;
};

void release(void* context) {
  auto* lease = static_cast<Lease*>(context);
  lease_word(lease->slab).fetch_sub(1, std::memory_order_acq_rel);
  delete lease;
}

c10::Storage leased_alias(const c10::Storage& slab) {
  void* data = slab.mutable_data();
  return c10::Storage(c10::Storage::use_byte_size_t(), slab.nbytes(),
                      c10::DataPtr(data, new Lease{slab}, &release, c10::Device(c10::DeviceType::CPU)),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

class Writer {
 public:
  void tensor(const at::Tensor& tensor) {
    const c10::Storage& storage = tensor.storage();
    auto [it, added] = index_.emplace(storage.unsafeGetStorageImpl(), static_cast<int64_t>(storages_.size()));
    if (added) storages_.push_back(storage);
    index_words_.push_back(words_.size());
    words_.push_back(it->second);
    words_.push_back(static_cast<int64_t>(tensor.scalar_type()));
    words_.push_back(tensor.storage_offset());
    words_.push_back(tensor.dim());
    for (int64_t size : tensor.sizes()) words_.push_back(size);
    for (int64_t stride : tensor.strides()) words_.push_back(stride);
  }

  void offsets(int64_t name, const std::string& key, const at::Tensor& tensor) {
    core::check_argument(tensor.device().is_cpu() && tensor.layout() == at::kStrided,
                         "pack: the row offsets of field '", key, "' must be a dense tensor on the CPU");
    words_.push_back(name);
    this->tensor(tensor);
  }

  void field(int64_t name, const std::string& key, const at::Tensor& tensor) {
    core::check_argument(tensor.device().is_cpu(), "pack: field '", key, "' is on ", tensor.device(),
                         ": batches cross from DataLoader workers on the CPU");
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
    core::check_argument(tensor.layout() == at::kStrided, "pack: field '", key, "' has a layout (", tensor.layout(),
                         ") that does not cross from DataLoader workers (dense and sparse CSR tensors do)");
    words_.push_back(kDense);
    this->tensor(tensor);
  }

  std::vector<int64_t>& words() { return words_; }
  const std::vector<c10::Storage>& storages() const { return storages_; }
  // Renumbers every tensor record's storage index: index i becomes renumber[i].
  void renumber(const std::vector<int64_t>& renumber) {
    for (size_t position : index_words_) words_[position] = renumber[static_cast<size_t>(words_[position])];
  }

 private:
  std::unordered_map<const c10::StorageImpl*, int64_t> index_;
  std::vector<c10::Storage> storages_;
  std::vector<int64_t> words_;
  std::vector<size_t> index_words_;  // where the tensor records' storage indices are in words_
};

class Reader {
 public:
  explicit Reader(const std::vector<int64_t>& words) : words_(words) {}

  int64_t next() {
    core::check_argument(position_ < words_.size(), "unpack: the description ends early");
    return words_[position_++];
  }
  int64_t count(const char* what) {
    const int64_t value = next();
    core::check_argument(value >= 0 && value <= kMaxCount, "unpack: bad ", what, " count ", value);
    return value;
  }
  bool done() const { return position_ == words_.size(); }

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
    bool overflow = false;
    for (int64_t d = 0; d < dim; ++d) {
      core::check_argument(sizes[d] >= 0 && strides[d] >= 0, "unpack: bad size or stride");
      overflow |= __builtin_mul_overflow(count, sizes[d], &count);
      int64_t reach = 0;
      if (sizes[d] > 0) {
        overflow |=
            __builtin_mul_overflow(sizes[d] - 1, strides[d], &reach) || __builtin_add_overflow(last, reach, &last);
      }
    }
    const c10::Storage& storage = storages[index];
    int64_t end = 0;
    overflow |= __builtin_add_overflow(last, 1, &end) || __builtin_mul_overflow(end, element, &end);
    core::check_argument(!overflow && (count == 0 || end <= static_cast<int64_t>(storage.nbytes())),
                         "unpack: a tensor reaches past its storage's ", storage.nbytes(), " bytes");
    // Made directly (no dispatcher, no zero-size allocation): a plain CPU tensor viewing the storage.
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                     c10::scalarTypeToTypeMeta(dtype));
    impl->set_sizes_and_strides(sizes, strides, offset);
    return at::Tensor(std::move(impl));
  }

 private:
  const std::vector<int64_t>& words_;
  size_t position_ = 0;
};

}  // namespace

int64_t leases(const c10::Storage& slab) { return lease_word(slab).load(std::memory_order_acquire); }

namespace {

Packed pack_units(const std::vector<UnitCut>& units, int64_t worker, const std::vector<int64_t>& worker_batches,
                  bool last) {
  Writer writer;
  Packed out;
  std::unordered_map<std::string, int64_t> name_index;
  const auto name_of = [&](const std::string& key) {
    auto [it, added] = name_index.emplace(key, static_cast<int64_t>(out.names.size()));
    if (added) out.names.push_back(key);
    return it->second;
  };
  for (const UnitCut& cut : units) {
    core::check_argument(cut.batch_size >= 0, "pack: batch size ", cut.batch_size, " (0: the unit is one batch)");
    // A conjugate or negative view's memory is not its values: such fields cross resolved.
    const sources::Batch unit = with_views_resolved(cut.unit);
    writer.words().push_back(cut.batch_size);
    writer.words().push_back(static_cast<int64_t>(unit.size()));
    for (const auto& item : unit) writer.field(name_of(item.key()), item.key(), item.value());
    writer.words().push_back(static_cast<int64_t>(cut.offsets.size()));
    for (const auto& item : cut.offsets) writer.offsets(name_of(item.key()), item.key(), item.value());
  }
  // Slabs first, then the other storages: the records' storage indices renumbered to that order.
  const std::vector<c10::Storage>& storages = writer.storages();
  std::vector<std::optional<SlabHandle>> handles;
  for (const c10::Storage& storage : storages) handles.push_back(slab_handle(storage));
  std::vector<std::pair<c10::Storage, SlabHandle>> slabs;
  std::vector<int64_t> renumber(storages.size());
  int64_t next_other = std::count_if(handles.begin(), handles.end(), [](const auto& h) { return h.has_value(); });
  for (size_t i = 0; i < storages.size(); ++i) {
    if (handles[i]) {
      renumber[i] = static_cast<int64_t>(slabs.size());
      slabs.emplace_back(storages[i], *handles[i]);
    } else {
      renumber[i] = next_other++;
      out.others.push_back(storages[i]);
    }
  }
  writer.renumber(renumber);
  const SlabOwner owner = slab_owner();
  const std::vector<int64_t> freed = take_freed_slabs();
  std::vector<int64_t>& words = out.description;
  words = {kVersion, owner.pid, owner.nonce, last ? 1 : 0, static_cast<int64_t>(freed.size())};
  words.insert(words.end(), freed.begin(), freed.end());
  words.push_back(static_cast<int64_t>(slabs.size()));
  for (const auto& [storage, handle] : slabs) {
    words.insert(words.end(), {handle.id, handle.fd, handle.inode, handle.bytes});
  }
  words.insert(words.end(), {static_cast<int64_t>(out.others.size()), static_cast<int64_t>(units.size()), worker,
                             static_cast<int64_t>(worker_batches.size())});
  words.insert(words.end(), worker_batches.begin(), worker_batches.end());
  words.insert(words.end(), writer.words().begin(), writer.words().end());
  // Leases last: nothing above can fail after one is taken.
  for (const auto& [storage, handle] : slabs) lease_word(storage).fetch_add(1, std::memory_order_acq_rel);
  return out;
}

// Whether a unit received can be cut as described without reaching outside its tensors: a CSR field's row
// offsets are read here (split_into_batches narrows its columns and values by them) and rebased into the
// memory set aside for them.
template <typename Index>
void check_row_offsets(const std::string& key, const at::Tensor& field) {
  const at::Tensor crow = field.crow_indices();
  const int64_t rows = field.size(0);
  core::check_argument(crow.dim() == 1 && crow.size(0) == rows + 1 && crow.is_contiguous() &&
                           field.col_indices().dim() == 1 && field.values().dim() >= 1 &&
                           field.col_indices().scalar_type() == crow.scalar_type(),
                       "unpack: field '", key, "' is not a CSR matrix of ", rows, " rows");
  const Index* offsets = crow.const_data_ptr<Index>();
  const int64_t stored = std::min(field.col_indices().size(0), field.values().size(0));
  bool ordered = offsets[0] >= 0 && offsets[rows] <= stored;
  for (int64_t r = 0; r < rows && ordered; ++r) ordered = offsets[r] <= offsets[r + 1];
  core::check_argument(ordered, "unpack: field '", key, "' has row offsets out of order or past its ", stored,
                       " stored values");
}

void check_cut(const UnitCut& cut) {
  const int64_t rows = rows_of(cut.unit, "unpack");
  const int64_t batches = (rows + cut.batch_size - 1) / cut.batch_size;
  for (const auto& item : cut.unit) {
    const at::Tensor& field = item.value();
    if (field.layout() != at::kSparseCsr) continue;
    const at::ScalarType index = field.crow_indices().scalar_type();
    core::check_argument(index == at::kInt || index == at::kLong, "unpack: field '", item.key(), "' has ", index,
                         " row offsets");
    if (index == at::kInt) {
      check_row_offsets<int32_t>(item.key(), field);
    } else {
      check_row_offsets<int64_t>(item.key(), field);
    }
  }
  for (const auto& item : cut.offsets) {
    const auto field = cut.unit.find(item.key());
    core::check_argument(field != cut.unit.end() && field->value().layout() == at::kSparseCsr, "unpack: offsets for '",
                         item.key(), "', which is not a CSR field of the unit");
    const at::Tensor& offsets = item.value();
    core::check_argument(offsets.dim() == 1 && offsets.size(0) == rows + batches && offsets.is_contiguous() &&
                             offsets.scalar_type() == field->value().crow_indices().scalar_type(),
                         "unpack: the offsets set aside for '", item.key(), "' do not fit ", batches, " batches of ",
                         rows, " rows");
  }
}

struct Received {
  std::vector<UnitCut> units;  // checked: each can be cut as it says
  int64_t worker = -1;
  std::vector<int64_t> worker_batches;
};

Received receive(const std::vector<int64_t>& description, const std::vector<std::string>& names,
                 const std::vector<c10::Storage>& others) {
  Reader reader(description);
  core::check_argument(reader.next() == kVersion, "unpack: the description comes from another torch_shards version");
  SlabOwner owner;
  owner.pid = reader.next();
  owner.nonce = reader.next();
  const bool last = reader.next() != 0;
  core::check_argument(owner.pid > 0, "unpack: bad process id ", owner.pid);
  std::vector<int64_t> freed(static_cast<size_t>(reader.count("freed slab")));
  for (int64_t& id : freed) id = reader.next();
  forget_slabs(owner.nonce, freed);  // before mapping: a freed slab's id is never reused, but its memory is gone
  const int64_t num_slabs = reader.count("slab");
  std::vector<SlabHandle> handles(static_cast<size_t>(num_slabs));
  for (SlabHandle& handle : handles) {
    handle.id = reader.next();
    handle.fd = reader.next();
    handle.inode = reader.next();
    handle.bytes = reader.next();
    core::check_argument(handle.fd >= 0 && handle.bytes >= static_cast<int64_t>(kSlabHeaderBytes),
                         "unpack: bad slab handle (descriptor ", handle.fd, ", ", handle.bytes, " bytes)");
  }
  const int64_t num_others = reader.count("storage");
  core::check_argument(num_others == static_cast<int64_t>(others.size()), "unpack: the description names ", num_others,
                       " storages besides its slabs, got ", others.size());
  Received out;
  const int64_t num_units = reader.count("unit");
  out.worker = reader.next();
  out.worker_batches.resize(static_cast<size_t>(reader.count("worker")));
  for (int64_t& count : out.worker_batches) count = reader.next();
  // Every check that needs no mapping is done: map the slabs, each viewed through one leased alias.
  std::vector<c10::Storage> storages;
  storages.reserve(handles.size() + others.size());
  for (const SlabHandle& handle : handles) storages.push_back(leased_alias(map_slab(owner, handle)));
  storages.insert(storages.end(), others.begin(), others.end());
  const auto name = [&]() -> const std::string& {
    const int64_t index = reader.next();
    core::check_argument(index >= 0 && index < static_cast<int64_t>(names.size()), "unpack: field name ", index,
                         " out of range");
    return names[static_cast<size_t>(index)];
  };
  for (int64_t u = 0; u < num_units; ++u) {
    UnitCut cut;
    cut.batch_size = reader.next();
    core::check_argument(cut.batch_size >= 0, "unpack: bad batch size ", cut.batch_size);
    const int64_t fields = reader.count("field");
    for (int64_t f = 0; f < fields; ++f) {
      const std::string& key = name();
      const int64_t kind = reader.next();
      if (kind == kDense) {
        cut.unit.insert(key, reader.tensor(storages));
        continue;
      }
      core::check_argument(kind == kSparseCsr, "unpack: unknown field kind ", kind);
      const int64_t rows = reader.next(), columns = reader.next();
      at::Tensor offsets = reader.tensor(storages), indices = reader.tensor(storages), values = reader.tensor(storages);
      cut.unit.insert(key, at::_sparse_csr_tensor_unsafe(offsets, indices, values, {rows, columns},
                                                         values.options().layout(at::kSparseCsr)));
    }
    const int64_t offsets = reader.count("offset");
    for (int64_t o = 0; o < offsets; ++o) {
      const std::string& key = name();
      cut.offsets.insert(key, reader.tensor(storages));
    }
    if (cut.batch_size > 0) check_cut(cut);
    out.units.push_back(std::move(cut));
  }
  core::check_argument(reader.done(), "unpack: the description has words left over");
  // The worker sends nothing more: its slabs stay mapped only as long as these batches' views.
  if (last) forget_slab_owner(owner.nonce);
  return out;
}

}  // namespace

Packed pack(const std::vector<sources::Batch>& batches, int64_t worker, const std::vector<int64_t>& worker_batches,
            bool last) {
  std::vector<UnitCut> units;
  units.reserve(batches.size());
  for (const sources::Batch& batch : batches) units.push_back(UnitCut{batch, 0, sources::Batch()});
  return pack(units, worker, worker_batches, last);
}

Packed pack(const std::vector<UnitCut>& units, int64_t worker, const std::vector<int64_t>& worker_batches, bool last) {
  return translate_errors([&] { return pack_units(units, worker, worker_batches, last); });
}

Unpacked unpack(const std::vector<int64_t>& description, const std::vector<std::string>& names,
                const std::vector<c10::Storage>& others) {
  return translate_errors([&] {
    Received received = receive(description, names, others);
    Unpacked out{{}, received.worker, std::move(received.worker_batches)};
    for (const UnitCut& cut : received.units) {
      for (sources::Batch& batch : cut_unit(cut)) out.batches.push_back(std::move(batch));
    }
    return out;
  });
}

UnpackedUnits unpack_units(const std::vector<int64_t>& description, const std::vector<std::string>& names,
                           const std::vector<c10::Storage>& others) {
  return translate_errors([&] {
    Received received = receive(description, names, others);
    UnpackedUnits out{{}, received.worker, std::move(received.worker_batches)};
    for (const UnitCut& cut : received.units) out.units.emplace_back(cut);
    return out;
  });
}

}  // namespace torch_shards
