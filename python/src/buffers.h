// Note [python buffers]: collectives work on the caller's memory in place. A Python argument is
// imported through DLPack or the buffer protocol (nanobind's ndarray import) WITHOUT conversion:
// nothing is ever copied, so an argument that would need a copy (non-contiguous, another
// dtype) is refused with an error naming the argument instead of silently reducing a temporary.
#pragma once

#include <nanobind/ndarray.h>

#include <cstddef>
#include <string>

#include "bindings.h"
#include "mwms/types.h"

namespace mwms::python {

/// A host buffer imported from a Python object: `count` elements of `dtype` at `data`. Holds the
/// import (and through it the Python object) alive; copy it to extend that. Destroy under the GIL.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  nb::ndarray<nb::ro> array;  ///< the import; keeps the exporter's memory alive
  nb::object owner;           ///< or the NumPy array itself (Note [python numpy fast path])
};

/// Imports `obj` (argument `name` of the call) as a C-contiguous host buffer of a libmwms dtype:
/// float32, float64, float16, bfloat16 (DLPack's bfloat, or an ml_dtypes.bfloat16 NumPy array),
/// int32, int64. With `writable`, a read-only buffer is refused. Never copies. A NumPy array of
/// a dtype imported before takes the fast path of Note [python numpy fast path]. Under the GIL.
/// @throws nb::type_error (not an array, an unsupported dtype, or a non-native byte order: Note
///   [python byte order]), InvalidArgument (read-only, not C-contiguous, not in host memory);
///   both name the argument.
Buffer import_buffer(nb::handle obj, const char* name, bool writable);

/// "float32[10]" for messages.
std::string describe(const Buffer& b);

}  // namespace mwms::python
