// The boundary between the core's exceptions and torch's: every public entry
// point of the library runs its body through translate_errors, so C++ users
// get c10::Error (c10::ValueError for bad arguments) and Python users the
// matching ValueError / RuntimeError, with the same message (bytes that are
// not UTF-8 escaped, so that Python can hold it).
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <new>

#include "core/errors.h"
#include "core/utf8.h"

namespace torch_shards {

template <typename F>
auto translate_errors(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error&) {
    throw;
  } catch (const core::MetadataError& e) {
    TORCH_CHECK_VALUE(false, core::valid_utf8(e.what()));
  } catch (const core::Unsupported& e) {
    TORCH_CHECK_VALUE(false, core::valid_utf8(e.what()));
  } catch (const core::InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, core::valid_utf8(e.what()));
  } catch (const std::bad_alloc&) {
    TORCH_CHECK(false, "torch_shards: out of memory");
  } catch (const std::exception& e) {
    TORCH_CHECK(false, core::valid_utf8(e.what()));
  }
}

}  // namespace torch_shards
