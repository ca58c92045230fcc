// Lets go of the Python GIL for a scope, when the calling thread holds it.
//
// The native objects are also destroyed by Python (a reader dropped without
// close() is destroyed in tp_dealloc, with the GIL held). A destructor that
// waits for threads must not hold the GIL meanwhile: a thread freeing a tensor
// that has a Python object needs it. The Python C API is looked up at run
// time, so the library still runs in programs without Python (LibTorch).
#pragma once

namespace torch_shards {

// Takes the Python GIL for a scope (a no-op without Python).
class HoldPythonGil {
 public:
  HoldPythonGil();
  ~HoldPythonGil();
  HoldPythonGil(const HoldPythonGil&) = delete;
  HoldPythonGil& operator=(const HoldPythonGil&) = delete;
  bool held() const { return held_; }

 private:
  bool held_ = false;
  int state_ = 0;  // PyGILState_STATE
};

class ReleasePythonGil {
 public:
  ReleasePythonGil();
  ~ReleasePythonGil();
  ReleasePythonGil(const ReleasePythonGil&) = delete;
  ReleasePythonGil& operator=(const ReleasePythonGil&) = delete;

 private:
  void* thread_state_ = nullptr;  // PyThreadState* saved when the GIL was let go
};

}  // namespace torch_shards
