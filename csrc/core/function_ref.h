// A non-owning reference to a callable, for callbacks that run before the
// call taking them returns (a decode run on a mapped chunk, a message built
// on failure). Unlike std::function it never allocates: hot paths call these
// once per chunk. The callable must outlive the FunctionRef (pass lambdas as
// arguments, never store one).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace torch_shards::core {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
      FunctionRef(F&& callable)  // NOLINT(google-explicit-constructor): passed like std::function
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(callable)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace torch_shards::core
