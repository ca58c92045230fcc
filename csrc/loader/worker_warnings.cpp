#include "loader/worker_warnings.h"

#include <ATen/ops/_sparse_csr_tensor_unsafe.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace torch_shards {
namespace {

struct DropWarnings : c10::WarningHandler {
  void process(const c10::Warning& /*warning*/) override {}
};

}  // namespace

void spend_sparse_csr_beta_warning() {
  static std::once_flag spent;
  std::call_once(spent, [] {
    DropWarnings drop;
    const c10::WarningUtils::WarningHandlerGuard guard(&drop);
    const at::Tensor offsets = at::zeros({1}, at::kLong);
    (void)at::_sparse_csr_tensor_unsafe(offsets, at::zeros({0}, at::kLong), at::zeros({0}, at::kFloat), {0, 0},
                                        at::TensorOptions().dtype(at::kFloat).layout(at::kSparseCsr));
  });
}

}  // namespace torch_shards
