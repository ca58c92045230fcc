#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/tensor_source.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/errors.h"
#include "core/streaming_copy.h"
#include "io/text.h"
#include "loader/batches.h"

namespace torch_shards::sources {

using core::check_argument;

namespace {

// Copy tasks of at least this many bytes: enough to amortise handing a task to a thread.
constexpr size_t kTaskBytes = 1 << 20;
// Rows at least this large are copied in source order (gather_rows).
constexpr size_t kSortedRowBytes = 32;

class TensorRead : public PlannedRead {
 public:
  TensorRead(const Batch& fields, const RowRequest& request) : fields_(fields), request_(request) {
    for (const auto& item : fields_) {
      const at::Tensor& tensor = item.value();
      if (!tensor.device().is_cpu()) continue;  // gathered on its own device, outside the unit's storage
      std::vector<int64_t> shape(tensor.sizes().begin(), tensor.sizes().end());
      shape[0] = request.num_out_rows();
      outputs_.push_back(OutputSpec{item.key(), OutputSpec::Part::kDense, TensorSpec{shape, tensor.scalar_type()}});
    }
  }

  Batch fill(const std::vector<at::Tensor>& tensors, ReadContext& context) override {
    const std::vector<int64_t>& rows = request_.rows;
    const auto index = at::from_blob(const_cast<int64_t*>(rows.data()), {static_cast<int64_t>(rows.size())},
                                     at::TensorOptions().dtype(at::kLong));
    Batch out;
    size_t next = 0;
    // Rows are read in ascending source order and written to their places: a
    // shuffled fetch read in delivery order jumps across the source at every
    // row, where in source order the hardware prefetcher streams each block
    // (2x the rows/s for block-shuffled 8 KB rows, +18% for 32-byte rows).
    // Fields of rows under kSortedRowBytes read them as listed: sorting costs
    // more than it saves there (-20% for 8-byte rows). Sorted once, for every
    // field that reads that way.
    const bool listed_in_order = std::is_sorted(rows.begin(), rows.end());
    thread_local std::vector<int64_t> order, scratch;  // kept by the thread: a large fetch's would be new pages
    const std::vector<int64_t>* by_row = nullptr;
    for (const auto& item : fields_) {
      const at::Tensor& tensor = item.value();
      if (!tensor.device().is_cpu()) {
        check_argument(request_.dests == nullptr, "Collection: field '", item.key(), "' is a tensor on ",
                       tensor.device(), "; a Collection reads CPU tensors only");
        out.insert(item.key(), at::index_select(tensor, 0, index.to(tensor.device())));
        continue;
      }
      at::Tensor gathered = tensors[next++];
      if (tensor.is_contiguous()) {
        const size_t row_bytes = tensor.size(0) == 0 ? 0 : tensor.nbytes() / static_cast<size_t>(tensor.size(0));
        const bool by_source = !listed_in_order && row_bytes >= kSortedRowBytes;
        if (by_source && by_row == nullptr) by_row = &request_.positions_by_row(order, scratch);
        gather_rows(static_cast<const uint8_t*>(tensor.const_data_ptr()), row_bytes, request_,
                    by_source ? by_row : nullptr, static_cast<uint8_t*>(gathered.data_ptr()), context.pool,
                    context.streams(static_cast<size_t>(request_.num_out_rows()) * row_bytes, row_bytes));
      } else if (request_.dests == nullptr) {
        at::index_select_out(gathered, tensor, 0, index);
      } else {
        const auto dests =
            at::from_blob(const_cast<int64_t*>(request_.dests->data()), {static_cast<int64_t>(request_.dests->size())},
                          at::TensorOptions().dtype(at::kLong));
        gathered.index_copy_(0, dests, at::index_select(tensor, 0, index));
      }
      out.insert(item.key(), gathered);
    }
    return out;
  }

 private:
  Batch fields_;
  RowRequest request_;
};

}  // namespace

void gather_rows(const uint8_t* source, size_t row_bytes, const RowRequest& request, const std::vector<int64_t>* order,
                 uint8_t* out, core::ThreadPool& pool, bool streaming) {
  const std::vector<int64_t>& rows = request.rows;
  const int64_t count = static_cast<int64_t>(rows.size());
  if (count == 0 || row_bytes == 0) return;
  const int64_t* positions = order != nullptr ? order->data() : nullptr;
  const auto position = [positions](int64_t k) { return positions != nullptr ? positions[k] : k; };
  const int64_t rows_per_task = std::max<int64_t>(1, static_cast<int64_t>(kTaskBytes / row_bytes));
  const int64_t tasks = (count + rows_per_task - 1) / rows_per_task;
  pool.parallel_for(tasks, [&](int64_t task) {
    const int64_t end = std::min(count, (task + 1) * rows_per_task);
    for (int64_t k = task * rows_per_task; k < end;) {
      // A run: consecutive source rows going to consecutive destinations.
      const int64_t i = position(k);
      int64_t length = 1;
      while (k + length < end && rows[position(k + length)] == rows[i] + length &&
             request.dest(position(k + length)) == request.dest(i) + length) {
        ++length;
      }
      core::copy_bytes(out + request.dest(i) * row_bytes, source + rows[i] * row_bytes, length * row_bytes, streaming);
      k += length;
    }
    if (streaming) core::streaming_fence();
  });
}

TensorSource::TensorSource(Batch fields) : fields_(with_views_resolved(fields)) {
  check_argument(!fields_.empty(), "TensorSource: needs at least one tensor");
  bool first = true;
  for (const auto& item : fields_) {
    const std::string& name = item.key();
    const at::Tensor& tensor = item.value();
    check_argument(name != "index", "TensorSource: the field name 'index' is reserved for row indices");
    check_argument(name.find('\0') == std::string::npos, "TensorSource: field name '", io::printable(name, 60),
                   "' contains a NUL character");
    check_argument(tensor.defined(), "TensorSource: field '", name, "' is an undefined tensor");
    check_argument(tensor.dim() >= 1, "TensorSource: field '", name,
                   "' must have at least one dimension (rows first), got a 0-d tensor");
    check_argument(!tensor.is_nested(), "TensorSource: field '", name,
                   "' is a nested tensor: its rows have different shapes (pad them into one tensor, or pass them as "
                   "the collection of a ShardedDataset)");
    check_argument(!tensor.is_quantized(), "TensorSource: field '", name, "' is a quantized tensor (",
                   tensor.scalar_type(), "): dequantize it first (tensor.dequantize() or tensor.int_repr())");
    check_argument(tensor.layout() == at::kStrided, "TensorSource: field '", name,
                   "' must be a dense (strided) tensor, got layout ", tensor.layout());
    if (first) {
      num_rows_ = tensor.size(0);
      first = false;
    }
    check_argument(tensor.size(0) == num_rows_, "TensorSource: all fields must have the same number of rows, field '",
                   name, "' has ", tensor.size(0), " but the first field has ", num_rows_);
  }
}

std::vector<FieldSpec> TensorSource::fields() const {
  std::vector<FieldSpec> specs;
  for (const auto& item : fields_) {
    const auto sizes = item.value().sizes();
    specs.push_back(FieldSpec{item.key(), item.value().scalar_type(), {sizes.begin() + 1, sizes.end()}, false});
  }
  return specs;
}

std::unique_ptr<PlannedRead> TensorSource::plan(const RowRequest& request, ReadContext&) const {
  return std::make_unique<TensorRead>(fields_, request);
}

std::string TensorSource::describe() const {
  std::ostringstream out;
  out << "TensorSource(rows=" << num_rows_;
  for (const auto& item : fields_) {
    out << ", " << item.key() << "=" << item.value().scalar_type() << item.value().sizes();
  }
  out << ")";
  return out.str();
}

}  // namespace torch_shards::sources
