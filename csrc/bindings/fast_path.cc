// The fast path of the most common call, and the gate every collective passes.
//
// IssueGate is which thread is issuing a collective on one communicator
// (ringreduce._comm.issuer keeps the names and messages): ranks pair calls in
// the order each issues them, so two threads must never issue at once. Python's
// general path enters and leaves it around every call; the fast path below
// enters it without a round trip through Python.
//
// IssueGate.all_reduce is all_reduce for numpy arrays in host memory, blocking,
// when nothing about them needs the general path's care: it reads them with
// the numpy C API and runs the collective on this thread. Any call it does not
// take on (another dtype, a non-contiguous array, another thread in the gate,
// a thread whose tag the engine does not have yet) it hands back, returning
// None before anything was issued, so every error about arguments is raised by
// one code, in Python.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/communicator.h"
#include "python_interrupt.h"

namespace py = pybind11;

namespace {

// The engine's dtype of a numpy dtype in native byte order, or false.
bool engine_dtype(const py::dtype& dt, rr::DataType* out) {
  const char order = dt.byteorder();
  if (order != '=' && order != '|') return false;
  const char kind = dt.kind();
  const py::ssize_t size = dt.itemsize();
  if (kind == 'f') {
    if (size == 2)
      *out = rr::DataType::kFloat16;
    else if (size == 4)
      *out = rr::DataType::kFloat32;
    else if (size == 8)
      *out = rr::DataType::kFloat64;
    else
      return false;
    return true;
  }
  if (kind == 'i') {
    if (size == 1)
      *out = rr::DataType::kInt8;
    else if (size == 4)
      *out = rr::DataType::kInt32;
    else if (size == 8)
      *out = rr::DataType::kInt64;
    else
      return false;
    return true;
  }
  if (kind == 'u' && size == 1) {
    *out = rr::DataType::kUInt8;
    return true;
  }
  return false;
}

// The op named by a Python str, or false (anything else takes the general path).
bool engine_op(py::handle op, rr::ReduceOp* out) {
  if (!PyUnicode_Check(op.ptr())) return false;
  const char* name = PyUnicode_AsUTF8(op.ptr());
  if (name == nullptr) {
    PyErr_Clear();
    return false;
  }
  static const struct {
    const char* name;
    rr::ReduceOp op;
  } kOps[] = {{"sum", rr::ReduceOp::kSum},
              {"prod", rr::ReduceOp::kProd},
              {"min", rr::ReduceOp::kMin},
              {"max", rr::ReduceOp::kMax},
              {"avg", rr::ReduceOp::kAvg}};
  for (const auto& o : kOps) {
    if (std::strcmp(name, o.name) == 0) {
      *out = o.op;
      return true;
    }
  }
  return false;
}

bool c_contiguous(const py::array& a) { return (a.flags() & py::array::c_style) != 0; }

// A numpy.ndarray itself: subclasses (masked arrays, np.matrix, memmaps) carry
// meaning the engine would drop, and the general path decides what to do with them.
bool exact_ndarray(py::handle obj) {
  return Py_TYPE(obj.ptr()) == py::detail::npy_api::get().PyArray_Type_;
}

// A new C-contiguous array of x's dtype and shape (numpy's C API directly:
// pybind11's constructor builds shape and strides vectors on the heap first).
py::array empty_like(const py::array& x) {
  auto& api = py::detail::npy_api::get();
  PyObject* descr = x.dtype().release().ptr();  // PyArray_NewFromDescr steals it
  PyObject* made = api.PyArray_NewFromDescr_(api.PyArray_Type_, descr, static_cast<int>(x.ndim()),
                                             x.shape(), nullptr, nullptr, 0, nullptr);
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::array>(made);
}

class IssueGate {
 public:
  // queue: a second thread waits for its turn (enter_wait) instead of being
  // refused; the general path decides which it does.
  IssueGate(rr::Communicator& comm, bool queue) : comm_(comm), queue_(queue) {}

  // 0: entered; 1: another thread is issuing; 2: this thread already is (a
  // signal handler's call inside its own).
  int try_enter(int kind) {
    const unsigned long me = PyThread_get_thread_ident();
    unsigned long expected = 0;
    if (owner_.compare_exchange_strong(expected, me, std::memory_order_acquire)) {
      kind_ = kind;
      return 0;
    }
    return expected == me ? 2 : 1;
  }

  // As try_enter, but waits while another thread is issuing (GIL released,
  // Ctrl-C still handled): never returns 1.
  int enter_wait(int kind) {
    const int first = try_enter(kind);
    if (first != 1) return first;
    const unsigned long me = PyThread_get_thread_ident();
    py::gil_scoped_release release;
    std::unique_lock<std::mutex> lock(mu_);
    ++waiters_;
    for (;;) {
      unsigned long expected = 0;
      if (owner_.compare_exchange_strong(expected, me, std::memory_order_acquire)) break;
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      lock.unlock();
      bool interrupted;
      {
        py::gil_scoped_acquire gil;
        interrupted = PyErr_CheckSignals() != 0;
      }
      lock.lock();
      if (interrupted) {
        --waiters_;
        lock.unlock();
        py::gil_scoped_acquire gil;
        throw py::error_already_set();
      }
    }
    --waiters_;
    kind_ = kind;
    return 0;
  }

  void leave() {
    owner_.store(0, std::memory_order_release);
    std::lock_guard<std::mutex> lock(mu_);  // a waiter is between its check and its wait
    if (waiters_ > 0) cv_.notify_all();
  }

  unsigned long owner() const { return owner_.load(); }
  int owner_kind() const { return kind_; }

  // The thread whose tag the engine has (set_issuer), 0 for none: the fast path
  // runs only on that thread, since another needs the header's tag changed.
  unsigned long tagged = 0;
  // Calls the fast path ran (for tests: which path a call took).
  uint64_t fast_calls = 0;
  // While compressed calls run in the background (the communicator's lane,
  // _comm/lane.py) the fast path declines: the general path waits for them, so
  // that calls reach the engine in the order the program issued them.
  std::atomic<bool> divert{false};

  // Once a conflict was found the communicator refuses every collective: the
  // fast path declines, and a call it ran meanwhile raises this message.
  void set_conflict(const std::string& message) {
    conflict_message_ = message;
    conflict_.store(true);
  }

  py::object all_reduce(py::handle x_obj, py::handle out_obj, py::handle op_obj) {
    if (conflict_.load(std::memory_order_relaxed)) return py::none();
    if (divert.load(std::memory_order_acquire)) return py::none();
    if (!queue_ && tagged != PyThread_get_thread_ident()) return py::none();
    if (!exact_ndarray(x_obj)) return py::none();
    auto x = py::reinterpret_borrow<py::array>(x_obj);
    rr::DataType dtype;
    rr::ReduceOp op;
    if (!c_contiguous(x) || !engine_dtype(x.dtype(), &dtype) || !engine_op(op_obj, &op)) {
      return py::none();
    }
    if (op == rr::ReduceOp::kAvg && !rr::is_floating(dtype)) return py::none();
    // (A default-constructed py::array would allocate an empty array.)
    py::array out = out_obj.is_none() ? empty_like(x) : py::reinterpret_borrow<py::array>(out_obj);
    if (!out_obj.is_none()) {
      if (!exact_ndarray(out_obj)) return py::none();
      if (!out.dtype().is(x.dtype()) && !out.dtype().equal(x.dtype())) return py::none();
      if (out.ndim() != x.ndim() || !std::equal(x.shape(), x.shape() + x.ndim(), out.shape())) {
        return py::none();
      }
      if (!c_contiguous(out) || !out.writeable()) return py::none();
      const char* a = static_cast<const char*>(x.data());
      const char* b = static_cast<const char*>(out.data());
      const auto n = static_cast<size_t>(x.nbytes());
      if (a != b && a < b + n && b < a + n) return py::none();  // partial overlap: an error
    }
    if (try_enter(static_cast<int>(rr::CollectiveKind::kAllReduce)) != 0) return py::none();
    rr::CollectiveArgs args;
    args.kind = rr::CollectiveKind::kAllReduce;
    args.send = x.data();
    args.recv = out.mutable_data();
    args.count = static_cast<size_t>(x.size());
    args.dtype = dtype;
    args.op = op;
    args.root = 0;
    args.device = -1;
    args.stream = 0;
    try {
      rr::PythonInterrupt interrupt;
      py::gil_scoped_release release;
      comm_.run(args, &interrupt);
    } catch (...) {
      leave();
      throw;
    }
    ++fast_calls;
    leave();
    if (conflict_.load()) raise_conflict();  // another thread came in meanwhile
    return std::move(out);
  }

 private:
  [[noreturn]] void raise_conflict() {
    py::object cls = py::module_::import("ringreduce.errors").attr("ConcurrentUseError");
    PyErr_SetString(cls.ptr(), conflict_message_.c_str());
    throw py::error_already_set();
  }

  rr::Communicator& comm_;
  const bool queue_;
  std::atomic<unsigned long> owner_{0};
  int kind_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiters_ = 0;
  std::atomic<bool> conflict_{false};
  std::string conflict_message_;
};

// ---- all_reduce as each Communicator's own attribute --------------------------
//
// Communicator.__init__ binds `comm.all_reduce` to a builtin made here, so that
// the common call runs without a Python frame: positional x (and op), keyword
// out/op, and async_op, compression, error_feedback absent or at their
// defaults go straight to the gate's fast path. Anything else, and any call
// the fast path declines, goes to the class's all_reduce (the Python method)
// with the arguments exactly as given. The builtin's self is a tuple
// (weakref to the communicator, the gate, the class's method, a capsule of the
// gate's address): no reference cycle, so a dropped communicator is still
// freed at once.

struct Names {
  PyObject* out;
  PyObject* op;
  PyObject* async_op;
  PyObject* compression;
  PyObject* error_feedback;
  PyObject* sum;
  PyObject* fast_failed;
  PyObject* ring_reduce_error;
};

Names& names() {
  static Names n = [] {
    Names made;
    made.out = PyUnicode_InternFromString("out");
    made.op = PyUnicode_InternFromString("op");
    made.async_op = PyUnicode_InternFromString("async_op");
    made.compression = PyUnicode_InternFromString("compression");
    made.error_feedback = PyUnicode_InternFromString("error_feedback");
    made.sum = PyUnicode_InternFromString("sum");
    made.fast_failed = PyUnicode_InternFromString("_fast_failed");
    made.ring_reduce_error =
        py::object(py::module_::import("ringreduce.errors").attr("RingReduceError")).release().ptr();
    return made;
  }();
  return n;
}

constexpr const char* kGateCapsule = "ringreduce._core.IssueGate";

// The fast path failed with the Python error that is set: an engine error goes
// through comm._fast_failed (naming threads, revoking), as the general path's
// errors do; returns null with the error to raise set.
PyObject* fast_path_failed(PyObject* comm) {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  if (comm == nullptr || value == nullptr ||
      PyObject_IsInstance(value, names().ring_reduce_error) != 1) {
    PyErr_Restore(type, value, trace);
    return nullptr;
  }
  PyObject* raised = PyObject_CallMethodOneArg(comm, names().fast_failed, value);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  if (raised == nullptr) return nullptr;
  PyException_SetTraceback(raised, Py_None);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(raised)), raised);
  Py_DECREF(raised);
  return nullptr;
}

PyObject* bound_all_reduce(PyObject* bound, PyObject* const* args, Py_ssize_t nargs,
                           PyObject* kwnames) {
  PyObject* comm = PyWeakref_GetObject(PyTuple_GET_ITEM(bound, 0));  // borrowed
  if (comm == Py_None) {
    PyErr_SetString(PyExc_ReferenceError, "all_reduce: the communicator no longer exists");
    return nullptr;
  }
  const Names& n = names();
  PyObject* x = nullptr;
  PyObject* op = n.sum;
  PyObject* out = Py_None;
  bool simple = nargs >= 1 && nargs <= 2;
  if (simple) {
    x = args[0];
    if (nargs == 2) op = args[1];
  }
  const Py_ssize_t keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; simple && i < keywords; ++i) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, i);
    PyObject* value = args[nargs + i];
    if (key == n.out) {
      out = value;
    } else if (key == n.op && nargs == 1) {
      op = value;
    } else if (key == n.async_op) {
      simple = value == Py_False;
    } else if (key == n.compression || key == n.error_feedback) {
      simple = value == Py_None;
    } else {
      simple = false;  // x=, a repeated op, a name not interned, a typo
    }
  }
  if (simple) {
    auto* gate = static_cast<IssueGate*>(
        PyCapsule_GetPointer(PyTuple_GET_ITEM(bound, 3), kGateCapsule));
    if (gate == nullptr) return nullptr;
    try {
      py::object result = gate->all_reduce(x, out, op);
      if (!result.is_none()) return result.release().ptr();
    } catch (...) {
      py::detail::try_translate_exceptions();
      Py_INCREF(comm);
      PyObject* failed = fast_path_failed(comm);
      Py_DECREF(comm);
      return failed;
    }
  }
  // The class's all_reduce(comm, *args, **kwargs), as called.
  PyObject* general = PyTuple_GET_ITEM(bound, 2);
  const Py_ssize_t total = nargs + keywords;
  std::vector<PyObject*> stack(static_cast<size_t>(total) + 1);
  stack[0] = comm;
  for (Py_ssize_t i = 0; i < total; ++i) stack[static_cast<size_t>(i) + 1] = args[i];
  Py_INCREF(comm);
  PyObject* result = PyObject_Vectorcall(general, stack.data(), nargs + 1, kwnames);
  Py_DECREF(comm);
  return result;
}

PyMethodDef kBoundAllReduce = {
    "all_reduce", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(bound_all_reduce)),
    METH_FASTCALL | METH_KEYWORDS, nullptr};

py::object bind_all_reduce(py::handle comm, py::object gate, py::object method) {
  auto* address = gate.cast<IssueGate*>();
  py::object capsule = py::reinterpret_steal<py::object>(
      PyCapsule_New(static_cast<void*>(address), kGateCapsule, nullptr));
  if (!capsule) throw py::error_already_set();
  py::object ref = py::reinterpret_steal<py::object>(PyWeakref_NewRef(comm.ptr(), nullptr));
  if (!ref) throw py::error_already_set();
  static std::string doc;  // the method's: the same text as the class's
  if (doc.empty()) {
    py::object text = method.attr("__doc__");
    doc = "all_reduce($self, x, op='sum', *, out=None, async_op=False, compression=None, "
          "error_feedback=None)\n--\n\n" +
          (text.is_none() ? std::string() : text.cast<std::string>());
    kBoundAllReduce.ml_doc = doc.c_str();
  }
  py::tuple bound = py::make_tuple(ref, gate, method, capsule);
  PyObject* made = PyCFunction_NewEx(&kBoundAllReduce, bound.ptr(), nullptr);
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(made);
}

}  // namespace

void register_fast_path(py::module_& m) {
  m.def("bind_all_reduce", &bind_all_reduce, py::arg("comm"), py::arg("gate"), py::arg("method"),
        "comm.all_reduce as a builtin: the fast path through `gate`, else `method` "
        "(Communicator.all_reduce) with the arguments as given.");
  py::class_<IssueGate>(m, "IssueGate",
                        "Which thread is issuing a collective on one communicator, and the fast "
                        "path of all_reduce through it (internal: see ringreduce._comm.issuer).")
      .def(py::init<rr::Communicator&, bool>(), py::arg("comm"), py::arg("queue"),
           py::keep_alive<1, 2>())
      .def("try_enter", &IssueGate::try_enter, py::arg("kind"),
           "0: entered; 1: another thread is issuing; 2: this thread already is.")
      .def("enter_wait", &IssueGate::enter_wait, py::arg("kind"),
           "As try_enter, but waits while another thread is issuing.")
      .def("leave", &IssueGate::leave)
      .def_property_readonly("owner", &IssueGate::owner,
                             "The ident of the thread issuing now (threading.get_ident), or 0.")
      .def_property_readonly("owner_kind", &IssueGate::owner_kind)
      .def_readwrite("tagged", &IssueGate::tagged)
      .def_readonly("fast_calls", &IssueGate::fast_calls)
      .def_property(
          "divert", [](const IssueGate& g) { return g.divert.load(); },
          [](IssueGate& g, bool on) { g.divert.store(on, std::memory_order_release); })
      .def("set_conflict", &IssueGate::set_conflict, py::arg("message"))
      .def("all_reduce", &IssueGate::all_reduce, py::arg("x"), py::arg("out"), py::arg("op"),
           "all_reduce of host numpy arrays, blocking: the result, or None (nothing was "
           "issued) when the general path must handle the call.");
}
