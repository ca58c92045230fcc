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
//   set_batch_type(type)       the dict subclass poll() makes (transfer.Batch)
//
// and the batches crossing from DataLoader workers (csrc/loader/transfer.h),
// pickled and unpickled once a batch by torch_shards/transfer.py:
//
//   pack(batches, worker, worker_batches, last)
//       (description bytes, field names, other storages as uint8 tensors), or
//       None if a value is not a CPU tensor (dense or sparse CSR)
//   poll_packed(handle, timeout_ms, max_bytes, sends_again)
//       BatchIterator.take_units' units, packed as pack() does, or None; sends_again: the worker sends
//       more after this iteration (an endless stream, or a persistent worker's next epoch), so its last
//       units are not marked last
//   unpack(description, names, others)
//       (list of batch dicts, worker, worker_batches)
//   unpack_lazy(description, names, others)
//       (batches, worker, worker_batches): batches made into dicts one by one by take(batches),
//       None after the last
//   mapped_slabs()             {"maps", "mapped", "mapped_bytes"} of this process
//   forget_dead_workers()      unmaps the slabs of worker processes that are gone
//   native_threads()           {"busy", "idle"}: this process's cached threads (core/thread_cache.h)
#include <ATen/ops/empty.h>
#include <Python.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/api/object.h>
#include <torch/csrc/utils/object_ptr.h>
#include <torch/custom_class.h>

#include <cstring>
#include <optional>
#include <type_traits>
#include <unordered_map>

#include <torch_shards/dataset.h>
#include "loader/batches.h"
#include "loader/dataset_door.h"
#include "loader/epoch_reader.h"
#include "loader/iteration.h"
#include "loader/transfer.h"

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

// The dict type poll() makes batches of (set_batch_type: torch_shards.transfer.Batch), a dict subclass
// made without running its __init__; plain dicts until it is set.
PyTypeObject* batch_type = nullptr;

PyObject* new_batch() {
  if (batch_type == nullptr) return PyDict_New();
  THPObjectPtr no_arguments(PyTuple_New(0));
  if (!no_arguments) return nullptr;
  return PyDict_Type.tp_new(batch_type, no_arguments.get(), nullptr);
}

PyObject* set_batch_type(PyObject* /*module*/, PyObject* type) {
  if (!PyType_Check(type) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type), &PyDict_Type)) {
    PyErr_SetString(PyExc_TypeError, "set_batch_type: expected a subclass of dict");
    return nullptr;
  }
  Py_INCREF(type);  // kept for the module's life
  Py_XDECREF(reinterpret_cast<PyObject*>(batch_type));
  batch_type = reinterpret_cast<PyTypeObject*>(type);
  Py_RETURN_NONE;
}

// The field names' Python strings, made once for the many batches of one call.
class Keys {
 public:
  PyObject* get(const std::string& name) {  // borrowed; nullptr with a Python error set
    auto it = keys_.find(name);
    if (it == keys_.end()) {
      // Whole: a C string would end at a NUL inside it.
      THPObjectPtr key(PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size())));
      if (!key) return nullptr;
      it = keys_.emplace(name, std::move(key)).first;
    }
    return it->second.get();
  }

 private:
  std::unordered_map<std::string, THPObjectPtr> keys_;
};

PyObject* batch_dict(const torch_shards::Batch& batch, bool typed, Keys& keys) {
  THPObjectPtr dict(typed ? new_batch() : PyDict_New());
  if (!dict) return nullptr;
  for (const auto& item : batch) {
    THPObjectPtr value(THPVariable_Wrap(item.value()));
    PyObject* key = keys.get(item.key());
    if (!value || key == nullptr || PyDict_SetItem(dict.get(), key, value.get()) != 0) return nullptr;
  }
  return dict.release();
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
    batch = torch_shards::DatasetDoor::poll(*impl, timeout_ms);
  }
  if (!batch) Py_RETURN_NONE;
  Keys keys;
  return batch_dict(*batch, /*typed=*/true, keys);
  END_HANDLE_TH_ERRORS
}

// The batch a dict of plain CPU tensors (dense or sparse CSR) is, or nullopt for any other dict.
std::optional<torch_shards::Batch> crossing_batch(PyObject* dict) {
  if (!PyDict_Check(dict)) return std::nullopt;
  torch_shards::Batch batch;
  PyObject *key = nullptr, *value = nullptr;
  Py_ssize_t position = 0;
  while (PyDict_Next(dict, &position, &key, &value)) {
    // A tensor subclass, or one that requires grad, crosses the torch way (which keeps what it is).
    if (!PyUnicode_Check(key) || !THPVariable_CheckExact(value)) return std::nullopt;
    const at::Tensor& tensor = THPVariable_Unpack(value);
    if (!tensor.device().is_cpu() || (tensor.layout() != at::kStrided && tensor.layout() != at::kSparseCsr) ||
        tensor.requires_grad()) {
      return std::nullopt;
    }
    Py_ssize_t size = 0;
    const char* name = PyUnicode_AsUTF8AndSize(key, &size);
    if (name == nullptr) throw python_error();
    batch.insert(std::string(name, static_cast<size_t>(size)), tensor);
  }
  return batch;
}

std::vector<int64_t> int_list(PyObject* sequence, const char* what) {
  THPObjectPtr fast(PySequence_Fast(sequence, what));
  if (!fast) throw python_error();
  const Py_ssize_t size = PySequence_Fast_GET_SIZE(fast.get());
  std::vector<int64_t> out(static_cast<size_t>(size));
  for (Py_ssize_t i = 0; i < size; ++i) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast.get(), i));
    if (out[i] == -1 && PyErr_Occurred()) throw python_error();
  }
  return out;
}

// pack()'s result as Python objects: (description bytes, names tuple, others as uint8 tensors).
PyObject* packed_tuple(const torch_shards::Packed& packed) {
  THPObjectPtr description(PyBytes_FromStringAndSize(reinterpret_cast<const char*>(packed.description.data()),
                                                     static_cast<Py_ssize_t>(packed.description.size() * 8)));
  THPObjectPtr names(PyTuple_New(static_cast<Py_ssize_t>(packed.names.size())));
  THPObjectPtr others(PyList_New(static_cast<Py_ssize_t>(packed.others.size())));
  if (!description || !names || !others) return nullptr;
  for (size_t i = 0; i < packed.names.size(); ++i) {
    const std::string& name = packed.names[i];
    PyObject* text = PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
    if (text == nullptr) return nullptr;
    PyTuple_SET_ITEM(names.get(), static_cast<Py_ssize_t>(i), text);
  }
  for (size_t i = 0; i < packed.others.size(); ++i) {
    const c10::Storage& storage = packed.others[i];
    at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte));
    bytes.set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
    PyObject* tensor = THPVariable_Wrap(bytes);
    if (tensor == nullptr) return nullptr;
    PyList_SET_ITEM(others.get(), static_cast<Py_ssize_t>(i), tensor);
  }
  return PyTuple_Pack(3, description.get(), names.get(), others.get());
}

PyObject* pack_batches(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4) {
    PyErr_Format(PyExc_TypeError, "pack(batches, worker, worker_batches, last) takes 4 arguments, got %zd", nargs);
    return nullptr;
  }
  THPObjectPtr dicts(PySequence_Fast(args[0], "pack: batches must be a sequence of dicts"));
  if (!dicts) return nullptr;
  std::vector<torch_shards::Batch> batches;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(dicts.get()); ++i) {
    std::optional<torch_shards::Batch> batch = crossing_batch(PySequence_Fast_GET_ITEM(dicts.get(), i));
    if (!batch) Py_RETURN_NONE;
    batches.push_back(std::move(*batch));
  }
  const long long worker = PyLong_AsLongLong(args[1]);
  if (worker == -1 && PyErr_Occurred()) return nullptr;
  const std::vector<int64_t> worker_batches = int_list(args[2], "pack: worker_batches must be a sequence of ints");
  const int last = PyObject_IsTrue(args[3]);
  if (last < 0) return nullptr;
  return packed_tuple(torch_shards::pack(batches, worker, worker_batches, last != 0));
  END_HANDLE_TH_ERRORS
}

PyObject* poll_packed(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4) {
    PyErr_Format(PyExc_TypeError, "poll_packed(handle, timeout_ms, max_bytes, sends_again) takes 4 arguments, got %zd",
                 nargs);
    return nullptr;
  }
  torch_shards::BatchIteratorImpl* impl = handle_target(args[0]);
  const long long timeout_ms = PyLong_AsLongLong(args[1]);
  if (timeout_ms == -1 && PyErr_Occurred()) return nullptr;
  const long long max_bytes = PyLong_AsLongLong(args[2]);
  if (max_bytes == -1 && PyErr_Occurred()) return nullptr;
  const int sends_again = PyObject_IsTrue(args[3]);
  if (sends_again < 0) return nullptr;
  std::vector<torch_shards::UnitCut> units;
  {
    pybind11::gil_scoped_release no_gil;  // as poll()
    units = torch_shards::DatasetDoor::take_units(*impl, timeout_ms, max_bytes);
  }
  if (units.empty()) Py_RETURN_NONE;
  const bool last = sends_again == 0 && impl->batches_delivered() == impl->num_batches();
  return packed_tuple(torch_shards::pack(units, torch_shards::DatasetDoor::iteration(*impl).worker,
                                         torch_shards::DatasetDoor::worker_batches(*impl), last));
  END_HANDLE_TH_ERRORS
}

// unpack()'s and unpack_lazy()'s arguments, unpacked natively (torch_shards::unpack or unpack_units into
// `unpacked`); false with a Python error set.
template <typename Unpacked>
bool unpack_arguments(const char* who, PyObject* const* args, Py_ssize_t nargs, Unpacked& unpacked) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "%s(description, names, others) takes 3 arguments, got %zd", who, nargs);
    return false;
  }
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(args[0], &data, &size) != 0) return false;
  if (size % 8 != 0) {
    PyErr_Format(PyExc_ValueError, "%s: a description is whole int64 words, got %zd bytes", who, size);
    return false;
  }
  std::vector<int64_t> description(static_cast<size_t>(size / 8));
  std::memcpy(description.data(), data, static_cast<size_t>(size));
  std::vector<std::string> names;
  THPObjectPtr name_items(PySequence_Fast(args[1], "unpack: names must be a sequence of str"));
  if (!name_items) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(name_items.get()); ++i) {
    Py_ssize_t length = 0;
    const char* name = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(name_items.get(), i), &length);
    if (name == nullptr) return false;
    names.emplace_back(name, static_cast<size_t>(length));
  }
  std::vector<c10::Storage> others;
  THPObjectPtr other_items(PySequence_Fast(args[2], "unpack: others must be a sequence of tensors"));
  if (!other_items) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(other_items.get()); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(other_items.get(), i);
    if (!THPVariable_Check(item)) {
      PyErr_Format(PyExc_TypeError, "%s: others must be tensors, got %s", who, Py_TYPE(item)->tp_name);
      return false;
    }
    others.push_back(THPVariable_Unpack(item).storage());
  }
  pybind11::gil_scoped_release no_gil;  // mapping a slab the first time may take a while
  if constexpr (std::is_same_v<Unpacked, torch_shards::UnpackedUnits>) {
    unpacked = torch_shards::unpack_units(description, names, others);
  } else {
    unpacked = torch_shards::unpack(description, names, others);
  }
  return true;
}

// (worker, worker_batches) of an unpacked description as Python objects; nullptr with a Python error set.
template <typename Unpacked>
PyObject* sender(const Unpacked& unpacked, PyObject* batches) {
  THPObjectPtr counts(PyList_New(static_cast<Py_ssize_t>(unpacked.worker_batches.size())));
  THPObjectPtr worker(PyLong_FromLongLong(unpacked.worker));
  if (!counts || !worker) return nullptr;
  for (size_t i = 0; i < unpacked.worker_batches.size(); ++i) {
    PyObject* count = PyLong_FromLongLong(unpacked.worker_batches[i]);
    if (count == nullptr) return nullptr;
    PyList_SET_ITEM(counts.get(), static_cast<Py_ssize_t>(i), count);
  }
  return PyTuple_Pack(3, batches, worker.get(), counts.get());
}

PyObject* unpack_batches(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  torch_shards::Unpacked unpacked;
  if (!unpack_arguments("unpack", args, nargs, unpacked)) return nullptr;
  THPObjectPtr batches(PyList_New(static_cast<Py_ssize_t>(unpacked.batches.size())));
  if (!batches) return nullptr;
  Keys keys;
  for (size_t i = 0; i < unpacked.batches.size(); ++i) {
    PyObject* dict = batch_dict(unpacked.batches[i], /*typed=*/false, keys);  // plain dicts in the training process
    if (dict == nullptr) return nullptr;
    PyList_SET_ITEM(batches.get(), static_cast<Py_ssize_t>(i), dict);
  }
  return sender(unpacked, batches.get());
  END_HANDLE_TH_ERRORS
}

// unpack_lazy's units, each batch cut and made into a dict only when take() takes it: a unit of many batches
// then makes no more Python objects than the batch in the loop (a list of them all outlived the cyclic
// collector's youngest generation and made a full collection, ~0.1 s beside torch, due every few epochs), and
// no intermediate dict of tensors is made per batch.
constexpr const char* kPendingName = "torch_shards.PendingBatches";

struct PendingBatches {
  std::vector<std::optional<torch_shards::UnitBatches>> units;  // each let go of after its last batch
  std::vector<std::vector<PyObject*>> names;                    // each unit's field names (owned by keys)
  size_t unit = 0;                                              // the unit under way
  int64_t next = 0;                                             // its next batch
  Keys keys;
  std::vector<at::Tensor> fields;  // the batch being made
};

void release_pending(PyObject* capsule) {
  delete static_cast<PendingBatches*>(PyCapsule_GetPointer(capsule, kPendingName));
}

PyObject* unpack_lazy(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  torch_shards::UnpackedUnits unpacked;
  if (!unpack_arguments("unpack_lazy", args, nargs, unpacked)) return nullptr;
  auto pending = std::make_unique<PendingBatches>();
  for (torch_shards::UnitBatches& unit : unpacked.units) {
    pending->units.emplace_back(std::move(unit));
    std::vector<PyObject*>& names = pending->names.emplace_back();
    for (const std::string& name : pending->units.back()->names()) {
      names.push_back(pending->keys.get(name));
      if (names.back() == nullptr) return nullptr;
    }
  }
  THPObjectPtr capsule(PyCapsule_New(pending.get(), kPendingName, release_pending));
  if (!capsule) return nullptr;
  pending.release();  // the capsule owns it
  return sender(unpacked, capsule.get());
  END_HANDLE_TH_ERRORS
}

PyObject* take_batch(PyObject* /*module*/, PyObject* capsule) {
  HANDLE_TH_ERRORS
  if (!PyCapsule_IsValid(capsule, kPendingName)) {
    PyErr_Format(PyExc_TypeError, "torch_shards._C.take: expected batches from unpack_lazy(), got %s",
                 Py_TYPE(capsule)->tp_name);
    return nullptr;
  }
  auto* pending = static_cast<PendingBatches*>(PyCapsule_GetPointer(capsule, kPendingName));
  while (pending->unit < pending->units.size() && pending->next == pending->units[pending->unit]->size()) {
    pending->units[pending->unit++].reset();  // a unit of no batch
    pending->next = 0;
  }
  if (pending->unit == pending->units.size()) Py_RETURN_NONE;
  const std::vector<PyObject*>& names = pending->names[pending->unit];
  std::optional<torch_shards::UnitBatches>& unit = pending->units[pending->unit];
  std::vector<at::Tensor>& fields = pending->fields;
  fields.clear();
  unit->cut(pending->next++, fields);
  if (pending->next == unit->size()) {  // its last batch: the batches' tensors alone hold the slab now
    unit.reset();
    ++pending->unit;
    pending->next = 0;
  }
  THPObjectPtr dict(PyDict_New());
  if (!dict) return nullptr;
  for (size_t f = 0; f < fields.size(); ++f) {
    THPObjectPtr value(THPVariable_Wrap(std::move(fields[f])));
    if (!value || PyDict_SetItem(dict.get(), names[f], value.get()) != 0) return nullptr;
  }
  return dict.release();
  END_HANDLE_TH_ERRORS
}

PyObject* mapped_slabs(PyObject* /*module*/, PyObject* /*unused*/) {
  HANDLE_TH_ERRORS
  const torch_shards::MappedSlabStats stats = torch_shards::mapped_slab_stats();
  return Py_BuildValue("{s:L,s:L,s:L}", "maps", static_cast<long long>(stats.maps), "mapped",
                       static_cast<long long>(stats.mapped), "mapped_bytes",
                       static_cast<long long>(stats.mapped_bytes));
  END_HANDLE_TH_ERRORS
}

PyObject* forget_dead_workers(PyObject* /*module*/, PyObject* /*unused*/) {
  HANDLE_TH_ERRORS
  torch_shards::forget_dead_slab_owners();
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* native_threads(PyObject* /*module*/, PyObject* /*unused*/) {
  HANDLE_TH_ERRORS
  const torch_shards::core::ThreadCacheStats stats = torch_shards::reader_thread_stats();
  return Py_BuildValue("{s:L,s:L}", "busy", static_cast<long long>(stats.busy), "idle",
                       static_cast<long long>(stats.idle));
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"iterator_handle", iterator_handle, METH_O,
     "iterator_handle(iterator): a handle on a torch.classes.torch_shards.BatchIterator for poll()"},
    {"poll", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(poll_batch)), METH_FASTCALL,
     "poll(handle, timeout_ms): the iterator's next batch, or None if none came within the timeout"},
    {"pack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pack_batches)), METH_FASTCALL,
     "pack(batches, worker, worker_batches, last): batches as they cross from a DataLoader worker, or None"},
    {"poll_packed", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(poll_packed)), METH_FASTCALL,
     "poll_packed(handle, timeout_ms, max_bytes, sends_again): BatchIterator.take_units' units, packed, or None"},
    {"unpack_lazy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(unpack_lazy)), METH_FASTCALL,
     "unpack_lazy(description, names, others): (batches for take(), worker, worker_batches)"},
    {"take", take_batch, METH_O, "take(batches): unpack_lazy's next batch as a dict, or None after the last"},
    {"unpack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(unpack_batches)), METH_FASTCALL,
     "unpack(description, names, others): (batches, worker, worker_batches) of what pack() made in a worker"},
    {"set_batch_type", set_batch_type, METH_O, "set_batch_type(type): the dict subclass poll() makes batches of"},
    {"mapped_slabs", mapped_slabs, METH_NOARGS, "mapped_slabs(): counts of the worker slabs this process maps"},
    {"native_threads", native_threads, METH_NOARGS, "native_threads(): {busy, idle} cached threads of this process"},
    {"forget_dead_workers", forget_dead_workers, METH_NOARGS,
     "forget_dead_workers(): unmaps the slabs of DataLoader worker processes that are gone"},
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
