// The fast path of the most common call, and the gate every collective passes.
//
// IssueGate is which thread is issuing a collective on one communicator
// (ringreduce._comm.core.issuer keeps the names and messages): ranks pair calls in
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
#include <memory>
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
  // _comm/compressed/lane.py) the fast path declines: the general path waits for them, so
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

  // Any collective on raw addresses, through the gate, with no Python frame
  // and no argument conversion: the torch backend's way in for tensors the
  // engine takes as they are (torch/direct.py). Declines (returns None,
  // nothing issued) where the general path must decide: a conflict was
  // found, compressed calls wait in the lane, or (where calls do not queue)
  // another thread holds the gate or this thread's tag is not the engine's.
  // Blocking: runs on this thread with the GIL released and returns True;
  // async_op: queues the call on the worker and returns its Work.
  py::object issue(const rr::CollectiveArgs& args, bool async_op) {
    if (conflict_.load(std::memory_order_relaxed)) return py::none();
    if (divert.load(std::memory_order_acquire)) return py::none();
    const int kind = static_cast<int>(args.kind);
    if (queue_) {
      if (enter_wait(kind) != 0) return py::none();
    } else if (tagged != PyThread_get_thread_ident() || try_enter(kind) != 0) {
      return py::none();
    }
    py::object result;
    try {
      if (async_op) {
        std::shared_ptr<rr::Work> work = comm_.submit(args);
        result = py::cast(std::move(work));
      } else {
        {
          rr::PythonInterrupt interrupt;
          py::gil_scoped_release release;
          comm_.run(args, &interrupt);
        }
        result = py::bool_(true);
      }
    } catch (...) {
      leave();
      throw;
    }
    ++fast_calls;
    leave();
    if (conflict_.load()) raise_conflict();
    return result;
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
// defaults go straight to the gate's fast path; a call it declines goes to
// the class's _declined (the general exact path, no second try). Anything
// else goes to the class's all_reduce (the Python method) with the arguments
// exactly as given. The builtin's self is a tuple (weakref to the
// communicator, the gate, the class's method, a capsule of the gate's address,
// the class's _declined): no reference cycle, so a dropped communicator is
// still freed at once.

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

// A fast call failed with the Python error that is set: an engine error
// (RingReduceError) goes through translate(exc), which returns the exception
// to raise (naming threads, revoking, wording it for torch); anything else is
// raised as it is. Returns null with the error to raise set.
PyObject* raise_translated(PyObject* translate) {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  if (translate == nullptr || value == nullptr ||
      PyObject_IsInstance(value, names().ring_reduce_error) != 1) {
    PyErr_Restore(type, value, trace);
    return nullptr;
  }
  PyObject* raised = PyObject_CallOneArg(translate, value);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  if (raised == nullptr) return nullptr;
  PyException_SetTraceback(raised, Py_None);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(raised)), raised);
  Py_DECREF(raised);
  return nullptr;
}

// comm.all_reduce's fast call failed: as the general path raises it
// (comm._fast_failed).
PyObject* fast_path_failed(PyObject* comm) {
  PyObject* type = PyErr_Occurred();
  if (type == nullptr || !PyErr_GivenExceptionMatches(type, names().ring_reduce_error)) {
    return nullptr;  // not the engine's: raised as it is
  }
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  PyObject* translate = PyObject_GetAttr(comm, names().fast_failed);
  PyErr_Restore(t, v, tb);
  if (translate == nullptr) return nullptr;
  PyObject* failed = raise_translated(translate);
  Py_DECREF(translate);
  return failed;
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
    // Declined, nothing issued: the general exact path, without a second try.
    PyObject* declined = PyTuple_GET_ITEM(bound, 4);
    PyObject* call[4] = {comm, x, op, out};
    Py_INCREF(comm);
    PyObject* result = PyObject_Vectorcall(declined, call, 4, nullptr);
    Py_DECREF(comm);
    return result;
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

py::object bind_all_reduce(py::handle comm, py::object gate, py::object method,
                           py::object declined) {
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
  py::tuple bound = py::make_tuple(ref, gate, method, capsule, declined);
  PyObject* made = PyCFunction_NewEx(&kBoundAllReduce, bound.ptr(), nullptr);
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(made);
}

// ---- issue(): IssueGate::issue as a builtin bound to one gate ---------------
//
// issue(kind, send, recv, count, dtype, op, root, device, stream, async_op),
// every argument a Python int (async_op a bool): ten integers through
// pybind11's conversions cost microseconds, as much as a small collective, so
// the builtin reads them with the C API. Its self is a capsule of the gate's
// address and the gate itself (keeping it alive).

bool read_u64(PyObject* value, const char* name, unsigned long long* out) {
  if (!PyLong_Check(value)) {
    PyErr_Format(PyExc_TypeError, "issue: %s must be an int", name);
    return false;
  }
  *out = PyLong_AsUnsignedLongLong(value);
  return !(*out == static_cast<unsigned long long>(-1) && PyErr_Occurred());
}

bool read_i64(PyObject* value, const char* name, long long* out) {
  if (!PyLong_Check(value)) {
    PyErr_Format(PyExc_TypeError, "issue: %s must be an int", name);
    return false;
  }
  *out = PyLong_AsLongLong(value);
  return !(*out == -1 && PyErr_Occurred());
}

PyObject* bound_issue(PyObject* bound, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 10) {
    PyErr_SetString(PyExc_TypeError,
                    "issue(kind, send, recv, count, dtype, op, root, device, stream, async_op)");
    return nullptr;
  }
  auto* gate =
      static_cast<IssueGate*>(PyCapsule_GetPointer(PyTuple_GET_ITEM(bound, 0), kGateCapsule));
  if (gate == nullptr) return nullptr;
  long long kind, dtype, op, root, device;
  unsigned long long send, recv, count, stream;
  if (!read_i64(args[0], "kind", &kind) || !read_u64(args[1], "send", &send) ||
      !read_u64(args[2], "recv", &recv) || !read_u64(args[3], "count", &count) ||
      !read_i64(args[4], "dtype", &dtype) || !read_i64(args[5], "op", &op) ||
      !read_i64(args[6], "root", &root) || !read_i64(args[7], "device", &device) ||
      !read_u64(args[8], "stream", &stream)) {
    return nullptr;
  }
  const int async_op = PyObject_IsTrue(args[9]);
  if (async_op < 0) return nullptr;
  if (kind < 1 || kind > rr::kLastCollectiveKind ||
      rr::compressed_kind(static_cast<rr::CollectiveKind>(kind)) || dtype < 0 ||
      dtype >= rr::kNumDataTypes || op < 0 || op >= rr::kNumReduceOps) {
    PyErr_Format(PyExc_ValueError, "issue: no such call (kind %lld, dtype %lld, op %lld)", kind,
                 dtype, op);
    return nullptr;
  }
  rr::CollectiveArgs call;
  call.kind = static_cast<rr::CollectiveKind>(kind);
  call.send = reinterpret_cast<const void*>(static_cast<uintptr_t>(send));
  call.recv = reinterpret_cast<void*>(static_cast<uintptr_t>(recv));
  call.count = static_cast<size_t>(count);
  call.dtype = static_cast<rr::DataType>(dtype);
  call.op = static_cast<rr::ReduceOp>(op);
  call.root = static_cast<int>(root);
  call.device = static_cast<int>(device);
  call.stream = static_cast<uintptr_t>(stream);
  try {
    return gate->issue(call, async_op != 0).release().ptr();
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
}

PyMethodDef kBoundIssue = {
    "issue", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(bound_issue)),
    METH_FASTCALL,
    "issue(kind, send, recv, count, dtype, op, root, device, stream, async_op)\n--\n\n"
    "A collective on raw addresses through the gate: None when it declined (nothing was "
    "issued; take the general path), True once a blocking call ran, the Work of a queued one."};

py::object bind_issue(py::object gate) {
  auto* address = gate.cast<IssueGate*>();
  py::object capsule = py::reinterpret_steal<py::object>(
      PyCapsule_New(static_cast<void*>(address), kGateCapsule, nullptr));
  if (!capsule) throw py::error_already_set();
  py::tuple bound = py::make_tuple(capsule, gate);
  PyObject* made = PyCFunction_NewEx(&kBoundIssue, bound.ptr(), nullptr);
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(made);
}

// ---- torch's allreduce -------------------------------------------------------
//
// ProcessGroupRingReduce.allreduce(tensors, opts) hands its arguments to a
// builtin made here (bind_torch_allreduce), which takes the common call
// (one dense, contiguous CPU tensor of an engine dtype, reduced in place)
// straight to the gate, reading the tensor and the options through the C API:
// on a small message the Python of the same checks costs more than the engine
// (torch/direct.py says the rule; this is its hot case). Everything else,
// and any call the gate declines, goes to the group's general method with
// the arguments as given. The builtin's self is a tuple:
//   (gate capsule, gate, general, queued, failed,
//    {torch dtype: engine code}, torch.strided, ((torch op, code), ...), avg code)
// queued(handle, tensors) makes the torch Work of a queued call; failed(exc)
// turns an engine error into the exception to raise.

struct TorchNames {
  PyObject* dtype;
  PyObject* layout;
  PyObject* is_contiguous;
  PyObject* is_neg;
  PyObject* is_cuda;
  PyObject* is_floating_point;
  PyObject* data_ptr;
  PyObject* numel;
  PyObject* reduce_op;
  PyObject* async_op;
};

TorchNames& torch_names() {
  static TorchNames n = [] {
    TorchNames made;
    made.dtype = PyUnicode_InternFromString("dtype");
    made.layout = PyUnicode_InternFromString("layout");
    made.is_contiguous = PyUnicode_InternFromString("is_contiguous");
    made.is_neg = PyUnicode_InternFromString("is_neg");
    made.is_cuda = PyUnicode_InternFromString("is_cuda");
    made.is_floating_point = PyUnicode_InternFromString("is_floating_point");
    made.data_ptr = PyUnicode_InternFromString("data_ptr");
    made.numel = PyUnicode_InternFromString("numel");
    made.reduce_op = PyUnicode_InternFromString("reduceOp");
    made.async_op = PyUnicode_InternFromString("asyncOp");
    return made;
  }();
  return n;
}

// obj.name as a new reference compared by identity with `expected`: 1, 0, or
// -1 with an error set.
int attr_is(PyObject* obj, PyObject* name, PyObject* expected) {
  PyObject* value = PyObject_GetAttr(obj, name);
  if (value == nullptr) return -1;
  const int same = value == expected;
  Py_DECREF(value);
  return same;
}

// obj.name() is True: 1, 0, or -1 with an error set.
int call_is_true(PyObject* obj, PyObject* name) {
  PyObject* value = PyObject_CallMethodNoArgs(obj, name);
  if (value == nullptr) return -1;
  const int truth = PyObject_IsTrue(value);
  Py_DECREF(value);
  return truth;
}

// obj.name() as an unsigned integer; false with an error set.
bool call_u64(PyObject* obj, PyObject* name, unsigned long long* out) {
  PyObject* value = PyObject_CallMethodNoArgs(obj, name);
  if (value == nullptr) return false;
  *out = PyLong_AsUnsignedLongLong(value);
  Py_DECREF(value);
  return !(*out == static_cast<unsigned long long>(-1) && PyErr_Occurred());
}

// 1: the call is the fast path's, its engine arguments in `call`; 0: the
// general path's; -1: an error is set.
int torch_all_reduce_args(PyObject* bound, PyObject* tensors, PyObject* opts,
                          rr::CollectiveArgs* call, bool* async_op) {
  const TorchNames& n = torch_names();
  if (opts == Py_None || !PyList_CheckExact(tensors) || PyList_GET_SIZE(tensors) != 1) return 0;
  PyObject* t = PyList_GET_ITEM(tensors, 0);
  PyObject* dtype = PyObject_GetAttr(t, n.dtype);
  if (dtype == nullptr) return -1;
  PyObject* code = PyDict_GetItemWithError(PyTuple_GET_ITEM(bound, 5), dtype);  // borrowed
  Py_DECREF(dtype);
  if (code == nullptr) return PyErr_Occurred() ? -1 : 0;
  int ok = attr_is(t, n.layout, PyTuple_GET_ITEM(bound, 6));
  if (ok <= 0) return ok;
  if ((ok = call_is_true(t, n.is_contiguous)) <= 0) return ok;
  if ((ok = call_is_true(t, n.is_neg)) != 0) return ok < 0 ? -1 : 0;
  if ((ok = attr_is(t, n.is_cuda, Py_False)) <= 0) return ok;
  PyObject* op = PyObject_GetAttr(opts, n.reduce_op);
  if (op == nullptr) return -1;
  PyObject* ops = PyTuple_GET_ITEM(bound, 7);
  long op_code = -1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ops) && op_code < 0; ++i) {
    PyObject* pair = PyTuple_GET_ITEM(ops, i);
    const int equal = PyObject_RichCompareBool(op, PyTuple_GET_ITEM(pair, 0), Py_EQ);
    if (equal < 0) {
      Py_DECREF(op);
      return -1;
    }
    if (equal) op_code = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
  }
  Py_DECREF(op);
  if (op_code < 0) return 0;  // an op the engine lacks: the general path says so
  if (op_code == PyLong_AsLong(PyTuple_GET_ITEM(bound, 8))) {
    if ((ok = call_is_true(t, n.is_floating_point)) <= 0) return ok;
  }
  PyObject* flag = PyObject_GetAttr(opts, n.async_op);
  if (flag == nullptr) return -1;
  const int async_flag = PyObject_IsTrue(flag);
  Py_DECREF(flag);
  if (async_flag < 0) return -1;
  unsigned long long ptr, count;
  if (!call_u64(t, n.data_ptr, &ptr) || !call_u64(t, n.numel, &count)) return -1;
  call->kind = rr::CollectiveKind::kAllReduce;
  call->send = reinterpret_cast<const void*>(static_cast<uintptr_t>(ptr));
  call->recv = reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
  call->count = static_cast<size_t>(count);
  call->dtype = static_cast<rr::DataType>(PyLong_AsLong(code));
  call->op = static_cast<rr::ReduceOp>(op_code);
  call->root = 0;
  call->device = -1;
  call->stream = 0;
  *async_op = async_flag != 0;
  return 1;
}

PyObject* bound_torch_all_reduce(PyObject* bound, PyObject* const* args, Py_ssize_t nargs) {
  PyObject* general = PyTuple_GET_ITEM(bound, 2);
  if (nargs != 2) return PyObject_Vectorcall(general, args, nargs, nullptr);
  PyObject* tensors = args[0];
  rr::CollectiveArgs call;
  bool async_op = false;
  const int fast = torch_all_reduce_args(bound, tensors, args[1], &call, &async_op);
  if (fast < 0) return nullptr;
  if (fast == 0) return PyObject_Vectorcall(general, args, nargs, nullptr);
  auto* gate =
      static_cast<IssueGate*>(PyCapsule_GetPointer(PyTuple_GET_ITEM(bound, 0), kGateCapsule));
  if (gate == nullptr) return nullptr;
  PyObject* got;
  try {
    got = gate->issue(call, async_op).release().ptr();
  } catch (...) {
    py::detail::try_translate_exceptions();
    return raise_translated(PyTuple_GET_ITEM(bound, 4));
  }
  if (got == Py_None) {
    Py_DECREF(got);
    return PyObject_Vectorcall(general, args, nargs, nullptr);
  }
  if (got == Py_True) {
    // A blocking call (opts.asyncOp false) has finished: no Work, as torch
    // allows ("the backend has synced at the C++ level"), which saves making
    // one for torch.distributed.all_reduce to wait on and drop. Only Python
    // asks for a blocking call: torch's C++ callers (DDP's reducer, the
    // functional collectives) leave asyncOp at its default, true.
    Py_DECREF(got);
    Py_RETURN_NONE;
  }
  PyObject* work = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(bound, 3), got, tensors, nullptr);
  Py_DECREF(got);
  return work;
}

PyMethodDef kBoundTorchAllReduce = {
    "allreduce",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(bound_torch_all_reduce)),
    METH_FASTCALL,
    "allreduce(tensors, opts)\n--\n\n"
    "torch's ProcessGroup.allreduce: one dense CPU tensor of an engine dtype straight to "
    "the gate (a blocking call returns None once done, an async one its Work), anything "
    "else to the group's general method."};

py::object bind_torch_allreduce(py::object gate, py::object general, py::object queued,
                                py::object failed, py::dict codes, py::object strided,
                                py::tuple ops, int avg) {
  auto* address = gate.cast<IssueGate*>();
  py::object capsule = py::reinterpret_steal<py::object>(
      PyCapsule_New(static_cast<void*>(address), kGateCapsule, nullptr));
  if (!capsule) throw py::error_already_set();
  for (const py::handle pair : ops) {
    if (!py::isinstance<py::tuple>(pair) || py::len(pair) != 2 ||
        !py::isinstance<py::int_>(pair.cast<py::tuple>()[1])) {
      throw py::type_error("bind_torch_allreduce: ops must be (torch op, int) pairs");
    }
  }
  for (const auto item : codes) {
    if (!py::isinstance<py::int_>(item.second)) {
      throw py::type_error("bind_torch_allreduce: codes must map torch dtypes to ints");
    }
  }
  py::tuple bound =
      py::make_tuple(capsule, gate, general, queued, failed, codes, strided, ops, avg);
  PyObject* made = PyCFunction_NewEx(&kBoundTorchAllReduce, bound.ptr(), nullptr);
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(made);
}

}  // namespace

void register_fast_path(py::module_& m) {
  m.def("bind_torch_allreduce", &bind_torch_allreduce, py::arg("gate"), py::arg("general"),
        py::arg("queued"), py::arg("failed"), py::arg("codes"), py::arg("strided"),
        py::arg("ops"), py::arg("avg"),
        "torch's ProcessGroup.allreduce as a builtin over `gate` (see fast_path.cc); "
        "calls it does not take go to `general` with the arguments as given.");
  m.def("bind_issue", &bind_issue, py::arg("gate"),
        "gate's issue(kind, send, recv, count, dtype, op, root, device, stream, async_op) as "
        "a builtin (see IssueGate::issue).");
  m.def("bind_all_reduce", &bind_all_reduce, py::arg("comm"), py::arg("gate"), py::arg("method"),
        py::arg("declined"),
        "comm.all_reduce as a builtin: the fast path through `gate` (a call it declines "
        "goes to `declined(comm, x, op, out)`), else `method` (Communicator.all_reduce) "
        "with the arguments as given.");
  py::class_<IssueGate>(m, "IssueGate",
                        "Which thread is issuing a collective on one communicator, and the fast "
                        "path of all_reduce through it (internal: see ringreduce._comm.core.issuer).")
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
