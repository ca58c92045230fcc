// torch_shards._C: the Python door's direct calls into the library, for what
// runs once a batch. A torch.classes method called from Python goes through
// torch's script-method dispatch (arguments matched against the schema, a
// module import, the result converted through IValues): ~3 us a call, a third
// of the consuming thread's time at block 64. Everything else the Python door
// calls goes through torch.classes.torch_shards; nothing is decided here.
//
//   iterator_handle(iterator)  a handle on a torch.classes.torch_shards.BatchIterator
//   poll(handle, timeout_ms)   BatchIterator.poll: the next batch (a dict of
//                              tensors), or None if none came within the timeout
#include <Python.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/api/object.h>
#include <torch/csrc/utils/object_ptr.h>
#include <torch/custom_class.h>

#include "torch_shards/dataset.h"

namespace {

constexpr const char* kHandleName = "torch_shards.BatchIterator";

torch_shards::BatchIteratorImpl* handle_target(PyObject* handle) {
  if (!PyCapsule_IsValid(handle, kHandleName)) {
    PyErr_Format(PyExc_TypeError, "torch_shards._C.poll: expected a handle from iterator_handle(), got %s",
                 Py_TYPE(handle)->tp_name);
    throw python_error();
  }
  return static_cast<torch_shards::BatchIteratorImpl*>(PyCapsule_GetPointer(handle, kHandleName));
}

void release_handle(PyObject* handle) {
  c10::raw::intrusive_ptr::decref(
      static_cast<torch_shards::BatchIteratorImpl*>(PyCapsule_GetPointer(handle, kHandleName)));
}

PyObject* iterator_handle(PyObject* /*module*/, PyObject* iterator) {
  HANDLE_TH_ERRORS
  c10::intrusive_ptr<torch_shards::BatchIteratorImpl> impl;
  const pybind11::handle object(iterator);
  if (pybind11::isinstance<torch::jit::Object>(object)) {
    const c10::IValue value(object.cast<torch::jit::Object>()._ivalue());
    if (value.type() == c10::getCustomClassType<c10::intrusive_ptr<torch_shards::BatchIteratorImpl>>()) {
      impl = value.toCustomClass<torch_shards::BatchIteratorImpl>();
    }
  }
  if (!impl) {
    PyErr_Format(PyExc_TypeError,
                 "torch_shards._C.iterator_handle: expected a torch.classes.torch_shards.BatchIterator, got %s",
                 Py_TYPE(iterator)->tp_name);
    return nullptr;
  }
  return PyCapsule_New(impl.release(), kHandleName, release_handle);  // the capsule holds the reference
  END_HANDLE_TH_ERRORS
}

PyObject* poll_batch(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2) {
    PyErr_Format(PyExc_TypeError, "poll(handle, timeout_ms) takes 2 arguments, got %zd", nargs);
    return nullptr;
  }
  torch_shards::BatchIteratorImpl* impl = handle_target(args[0]);
  const long long timeout_ms = PyLong_AsLongLong(args[1]);
  if (timeout_ms == -1 && PyErr_Occurred()) return nullptr;
  std::optional<torch_shards::Batch> batch;
  {
    pybind11::gil_scoped_release no_gil;  // as torch.classes calls: the reader threads may need it
    batch = impl->poll(timeout_ms);
  }
  if (!batch) Py_RETURN_NONE;
  THPObjectPtr dict(PyDict_New());
  if (!dict) return nullptr;
  for (const auto& item : *batch) {
    THPObjectPtr value(THPVariable_Wrap(item.value()));
    const std::string& name = item.key();  // whole: a C string would end at a NUL inside it
    THPObjectPtr key(PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size())));
    if (!value || !key || PyDict_SetItem(dict.get(), key.get(), value.get()) != 0) return nullptr;
  }
  return dict.release();
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"iterator_handle", iterator_handle, METH_O,
     "iterator_handle(iterator): a handle on a torch.classes.torch_shards.BatchIterator for poll()"},
    {"poll", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(poll_batch)), METH_FASTCALL,
     "poll(handle, timeout_ms): the iterator's next batch, or None if none came within the timeout"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT,
                      "torch_shards._C",
                      "The Python door's per-batch calls into the torch_shards library",
                      -1,
                      methods,
                      nullptr,
                      nullptr,
                      nullptr,
                      nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module); }
