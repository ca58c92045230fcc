#include "loader/sparse_csr_warning.h"

#include <ATen/ops/_sparse_csr_tensor_unsafe.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>

namespace torch_shards {
namespace {

struct DropWarnings : c10::WarningHandler {
  void process(const c10::Warning& /*warning*/) override {}
};

// An empty CSR tensor: torch raises its warning at the first one a process makes.
void make_empty_csr_tensor() {
  (void)at::_sparse_csr_tensor_unsafe(at::zeros({1}, at::kLong), at::zeros({0}, at::kLong), at::zeros({0}), {0, 0},
                                      at::TensorOptions().dtype(at::kFloat).layout(at::kSparseCsr));
}

bool has_sparse_csr_field(const sources::Source& source) {
  const std::vector<sources::FieldSpec> fields = source.fields();
  return std::any_of(fields.begin(), fields.end(), [](const sources::FieldSpec& f) { return f.sparse_csr; });
}

}  // namespace

void raise_sparse_csr_warning_here(const sources::Source& source) {
  static std::atomic<bool> raised{false};  // by us: torch raises it once a process whoever asks again
  if (raised.load(std::memory_order_relaxed) || !has_sparse_csr_field(source)) return;
  raised.store(true, std::memory_order_relaxed);
  make_empty_csr_tensor();
}

void spend_sparse_csr_warning_silently(const sources::Source& source) {
  static std::once_flag spent;
  if (!has_sparse_csr_field(source)) return;  // what else the worker makes warns as it would
  std::call_once(spent, [] {
    DropWarnings drop;
    const c10::WarningUtils::WarningHandlerGuard guard(&drop);
    make_empty_csr_tensor();
  });
}

}  // namespace torch_shards
