// Importing Python arrays as libmwms buffers (Note [python buffers]).
#include "buffers.h"

#include <cstring>
#include <iterator>
#include <string>

#include "mwms/errors.h"

namespace mwms::python {
namespace {

constexpr const char* kSupported = "float32, float64, float16, bfloat16, int32 or int64";

std::string py_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  const char* kind = "?";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
    default: break;
  }
  std::string s = kind + std::to_string(dt.bits);
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

// libmwms's dtype of a DLPack dtype; false when libmwms has none.
bool to_data_type(nb::dlpack::dtype dt, DataType* out) {
  if (dt.lanes != 1) return false;
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  if (code == nb::dlpack::dtype_code::Float) {
    if (dt.bits == 32) *out = DataType::kFloat32;
    if (dt.bits == 64) *out = DataType::kFloat64;
    if (dt.bits == 16) *out = DataType::kFloat16;
    return dt.bits == 16 || dt.bits == 32 || dt.bits == 64;
  }
  if (code == nb::dlpack::dtype_code::Bfloat && dt.bits == 16) {
    *out = DataType::kBFloat16;
    return true;
  }
  if (code == nb::dlpack::dtype_code::Int) {
    if (dt.bits == 32) *out = DataType::kInt32;
    if (dt.bits == 64) *out = DataType::kInt64;
    return dt.bits == 32 || dt.bits == 64;
  }
  return false;
}

constexpr bool kLittleEndianHost = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// Note [python byte order]: libmwms reduces native-order values only. NumPy's __dlpack__ refuses
// a byte-swapped array and nanobind refuses a buffer format with a foreign byte-order prefix,
// so such an argument fails the import; this names why (a byte-swapped copy would be silent and
// would not be reduced in place). Checked only after the import failed, and before the bfloat16
// fallback below, whose uint16 view would otherwise reduce swapped bytes as native ones. Sets
// `*what` to the dtype or buffer format for the message.
bool non_native_byte_order(nb::handle obj, std::string* what) {
  if (nb::hasattr(obj, "dtype")) {
    nb::object dtype = obj.attr("dtype");
    if (!nb::hasattr(dtype, "isnative") || nb::cast<bool>(dtype.attr("isnative"))) return false;
    // NumPy's str() of a swapped ml_dtypes.bfloat16 is '>V2'; byteorder + name reads better.
    *what = "dtype " + std::string(nb::str(dtype.attr("name")).c_str()) + " ('" +
            nb::str(dtype.attr("byteorder")).c_str() + "')";
    return true;
  }
  if (!PyObject_CheckBuffer(obj.ptr())) return false;
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  const char order = view.format != nullptr ? view.format[0] : '@';
  const bool foreign = kLittleEndianHost ? (order == '>' || order == '!') : order == '<';
  if (foreign) *what = std::string("buffer format '") + view.format + "'";
  PyBuffer_Release(&view);
  return foreign;
}

// NumPy exports neither DLPack nor a buffer format for ml_dtypes' bfloat16, so such an array is
// imported through a uint16 view of the same memory (a view: no copy, same writability). Only a
// native-order one gets here (Note [python byte order]).
bool is_ml_dtypes_bfloat16(nb::handle obj) {
  if (!nb::hasattr(obj, "dtype") || !nb::hasattr(obj, "view")) return false;
  nb::object dtype = obj.attr("dtype");
  return nb::hasattr(dtype, "name") && nb::str(dtype.attr("name")).equal(nb::str("bfloat16")) &&
         nb::hasattr(dtype, "itemsize") && nb::cast<int>(dtype.attr("itemsize")) == 2;
}

bool c_contiguous(const nb::ndarray<nb::ro>& a) {
  if (a.size() <= 1) return true;
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

// Imports `obj` without conversion into `b.array`; returns false when it exports neither
// protocol (or a format nanobind does not know); sets `*read_only`.
bool import_array(nb::handle obj, Buffer& b, bool* read_only) {
  // Writable first: the read-only import also accepts writable arrays, so only its success
  // after the writable one failed tells a read-only array.
  nb::ndarray<> rw;
  if (nb::try_cast(obj, rw, /*convert=*/false)) {
    b.array = nb::ndarray<nb::ro>(rw);
    *read_only = false;
    return true;
  }
  *read_only = true;
  return nb::try_cast(obj, b.array, /*convert=*/false);
}

// Note [python numpy fast path]: importing a NumPy array through DLPack costs about 0.4 us per
// call (numpy's __dlpack__ parses its arguments and allocates a capsule and a DLManagedTensor,
// nanobind wraps it), a third of a small collective's whole cost from Python. A NumPy array of
// exactly numpy.ndarray's type whose dtype object already came through the full import once
// (DLPack or the buffer protocol, all checks) is read straight from numpy's array struct
// instead: data, dimensions, flags and descr are numpy's public C ABI (PyArrayObject_fields,
// the fields behind PyArray_DATA, PyArray_DIMS, PyArray_FLAGS and PyArray_DESCR, laid out the
// same in numpy 1 and 2), read here without numpy's headers. Only the descr's identity is used:
// each dtype in the table is kept referenced, so its address is never reused by another while
// it is there. The table is small and full ones evict round-robin: equal dtype objects are not
// rare (every unpickled array, every np.dtype(..., metadata=...) has a fresh one), and a table
// kept for good by the first 16 left every later dtype on the full import. An array the
// fast path does not accept (another type, a new dtype, not C-contiguous, read-only when
// written) takes the full import, which says why it is refused. The Buffer then holds the array
// itself, which keeps its memory alive (numpy refuses to resize an array that others reference).
struct NumpyArrayFields {  // numpy's PyArrayObject_fields, the part read here
  PyObject_HEAD
  char* data;
  int nd;
  Py_ssize_t* dimensions;
  Py_ssize_t* strides;
  PyObject* base;
  PyObject* descr;
  int flags;
};
constexpr int kNpyCContiguous = 0x0001;  // NPY_ARRAY_C_CONTIGUOUS
constexpr int kNpyWriteable = 0x0400;    // NPY_ARRAY_WRITEABLE

struct KnownDescr {
  PyObject* descr;  // a strong reference, released when evicted
  DataType dtype;
};
PyTypeObject* g_ndarray_type = nullptr;  // numpy.ndarray once seen (a strong reference)
KnownDescr g_known[16];
int g_num_known = 0;
int g_next_evicted = 0;  // the slot a full table replaces next

bool numpy_fast_path(nb::handle obj, bool writable, Buffer* b) {
  if (Py_TYPE(obj.ptr()) != g_ndarray_type || g_ndarray_type == nullptr) return false;
  const auto* a = reinterpret_cast<const NumpyArrayFields*>(obj.ptr());
  const int need = kNpyCContiguous | (writable ? kNpyWriteable : 0);
  if ((a->flags & need) != need || a->nd < 0) return false;
  const KnownDescr* known = nullptr;
  for (int i = 0; i < g_num_known; ++i) {
    if (g_known[i].descr == a->descr) known = &g_known[i];
  }
  if (known == nullptr) return false;
  std::size_t count = 1;
  for (int i = 0; i < a->nd; ++i) count *= static_cast<std::size_t>(a->dimensions[i]);
  b->data = a->data;
  b->count = count;
  b->dtype = known->dtype;
  b->owner = nb::borrow(obj);
  return true;
}

// After a full import of `obj` as `dtype` succeeded: lets the fast path take its dtype next time.
void remember_numpy_dtype(nb::handle obj, DataType dtype) {
  PyTypeObject* type = Py_TYPE(obj.ptr());
  if (g_ndarray_type == nullptr) {
    if (std::strcmp(type->tp_name, "numpy.ndarray") != 0) return;
    Py_INCREF(reinterpret_cast<PyObject*>(type));
    g_ndarray_type = type;
  }
  if (type != g_ndarray_type) return;
  PyObject* descr = reinterpret_cast<const NumpyArrayFields*>(obj.ptr())->descr;
  for (int i = 0; i < g_num_known; ++i) {
    if (g_known[i].descr == descr) return;
  }
  if (descr == nullptr) return;
  Py_INCREF(descr);
  if (g_num_known < static_cast<int>(std::size(g_known))) {
    g_known[g_num_known++] = KnownDescr{descr, dtype};
    return;
  }
  KnownDescr& slot = g_known[g_next_evicted];
  g_next_evicted = (g_next_evicted + 1) % static_cast<int>(std::size(g_known));
  PyObject* evicted = slot.descr;
  slot = KnownDescr{descr, dtype};
  // Last: the dtype's deallocation may run Python code (its metadata's), which may call in here.
  Py_DECREF(evicted);
}

}  // namespace

Buffer import_buffer(nb::handle obj, const char* name, bool writable) {
  Buffer b;
  if (numpy_fast_path(obj, writable, &b)) return b;
  const std::string arg = std::string("argument '") + name + "'";
  bool read_only = false;
  bool bfloat16_view = false;
  if (!import_array(obj, b, &read_only)) {
    // Checked only here, off the common path: numpy computes dtype.name in Python.
    std::string order;
    if (non_native_byte_order(obj, &order)) {
      throw nb::type_error((arg + " has " + order + " in non-native byte order; libmwms reduces "
                            "native-order " + kSupported + " in place and never copies (pass "
                            "a.astype(a.dtype.newbyteorder('=')), and use its result)").c_str());
    }
    if (!is_ml_dtypes_bfloat16(obj) ||
        !import_array(obj.attr("view")(nb::str("uint16")), b, &read_only)) {
      throw nb::type_error((arg + " must be an array exporting DLPack or the buffer protocol "
                            "(a NumPy array, a PyTorch CPU tensor, ...) of " + kSupported +
                            ", not " + py_type_name(obj)).c_str());
    }
    bfloat16_view = true;
  }
  if (writable && read_only) {
    throw InvalidArgument(arg + " is read-only; the collective writes its result into it in "
                          "place (pass a writable array, e.g. a.copy())");
  }
  if (b.array.device_type() != nb::device::cpu::value) {
    throw InvalidArgument(arg + " is not in host memory (DLPack device type " +
                          std::to_string(b.array.device_type()) +
                          "); this build's Communicator takes host buffers only");
  }
  if (bfloat16_view) {
    b.dtype = DataType::kBFloat16;
  } else if (!to_data_type(b.array.dtype(), &b.dtype)) {
    throw nb::type_error((arg + " has dtype " + dlpack_dtype_name(b.array.dtype()) +
                          "; libmwms reduces " + kSupported).c_str());
  }
  if (!c_contiguous(b.array)) {
    // The fix in the exporter's own words: a PyTorch tensor has .contiguous(), NumPy a function.
    const bool tensor = nb::hasattr(obj, "is_contiguous") && nb::hasattr(obj, "contiguous");
    const std::string fix = tensor ? "x.contiguous()" : "numpy.ascontiguousarray(x)";
    throw InvalidArgument(arg + " is not C-contiguous; libmwms works in place and never copies "
                          "(pass " + fix + ", and use its result)");
  }
  b.data = const_cast<void*>(b.array.data());
  b.count = b.array.size();
  remember_numpy_dtype(obj, b.dtype);
  return b;
}

std::string describe(const Buffer& b) {
  return std::string(to_string(b.dtype)) + "[" + std::to_string(b.count) + "]";
}

}  // namespace mwms::python
