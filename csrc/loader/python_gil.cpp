#include "loader/python_gil.h"

#include <dlfcn.h>

namespace torch_shards {
namespace {

// The few Python C API functions needed, from the running process (null
// members when it has no Python interpreter).
struct PythonApi {
  int (*is_initialized)() = nullptr;        // Py_IsInitialized
  int (*holds_gil)() = nullptr;             // PyGILState_Check
  void* (*save_thread)() = nullptr;         // PyEval_SaveThread
  void (*restore_thread)(void*) = nullptr;  // PyEval_RestoreThread
  int (*ensure)() = nullptr;                // PyGILState_Ensure
  void (*release)(int) = nullptr;           // PyGILState_Release

  bool available() const { return is_initialized && holds_gil && save_thread && restore_thread; }
};

template <typename Function>
void look_up(Function& function, const char* name) {
  function = reinterpret_cast<Function>(::dlsym(RTLD_DEFAULT, name));
}

const PythonApi& python_api() {
  static const PythonApi api = [] {
    PythonApi found;
    look_up(found.is_initialized, "Py_IsInitialized");
    look_up(found.holds_gil, "PyGILState_Check");
    look_up(found.save_thread, "PyEval_SaveThread");
    look_up(found.restore_thread, "PyEval_RestoreThread");
    look_up(found.ensure, "PyGILState_Ensure");
    look_up(found.release, "PyGILState_Release");
    return found;
  }();
  return api;
}

}  // namespace

HoldPythonGil::HoldPythonGil() {
  const PythonApi& api = python_api();
  if (api.available() && api.ensure && api.release && api.is_initialized()) {
    state_ = api.ensure();
    held_ = true;
  }
}

HoldPythonGil::~HoldPythonGil() {
  if (held_) python_api().release(state_);
}

ReleasePythonGil::ReleasePythonGil() {
  const PythonApi& api = python_api();
  if (api.available() && api.is_initialized() && api.holds_gil()) thread_state_ = api.save_thread();
}

ReleasePythonGil::~ReleasePythonGil() {
  if (thread_state_ != nullptr) python_api().restore_thread(thread_state_);
}

}  // namespace torch_shards
