// Value handles over the native objects (torch.classes.torch_shards.*), in
// the manner of torch::nn's ModuleHolder: copies share one object, as Python
// names do, `handle->method()` reaches the object and `handle.native()` is
// the script object to hand to TorchScript.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <utility>

namespace torch_shards {

template <typename Impl>
class Handle {
 public:
  explicit Handle(c10::intrusive_ptr<Impl> impl) : impl_(std::move(impl)) {
    TORCH_CHECK(impl_, "torch_shards: a handle needs an object, got null");
  }

  Impl* operator->() const { return impl_.get(); }
  Impl& operator*() const { return *impl_; }
  // The script object (torch.classes.torch_shards.*), e.g. for a TorchScript module attribute.
  const c10::intrusive_ptr<Impl>& native() const { return impl_; }

 protected:
  c10::intrusive_ptr<Impl> impl_;
};

}  // namespace torch_shards
