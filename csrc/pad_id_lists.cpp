// The collator's fast path from tokenizer output to a tensor: rows of Python ints padded into one
// int64 [rows, seq] tensor, read through the Python C API (masking.h).
#include <Python.h>

#include <algorithm>

#include "cpu_ops.h"
#include "masking.h"

namespace fastbert {

at::Tensor pad_id_lists(PyObject* rows, int64_t seq, int64_t pad_value) {
  const char* op = "fastbert._C.pad_id_lists";
  TORCH_CHECK_VALUE(seq >= 0, op, ": seq must be >= 0, got ", seq);
  TORCH_CHECK_TYPE(PyList_Check(rows) || PyTuple_Check(rows), op, ": rows must be a list or tuple of lists");
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(rows);
  at::Tensor out = detail::empty({static_cast<int64_t>(n), seq}, at::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  PyObject** row_items = PySequence_Fast_ITEMS(rows);
  for (Py_ssize_t r = 0; r < n; ++r) {
    PyObject* row = row_items[r];
    TORCH_CHECK_TYPE(PyList_Check(row) || PyTuple_Check(row), op, ": row ", r, " is a ", Py_TYPE(row)->tp_name,
                     ", not a list or tuple");
    const Py_ssize_t len = PySequence_Fast_GET_SIZE(row);
    TORCH_CHECK_VALUE(len <= seq, op, ": row ", r, " has ", len, " ids, more than seq = ", seq);
    PyObject** items = PySequence_Fast_ITEMS(row);
    int64_t* dst = o + r * seq;
    for (Py_ssize_t i = 0; i < len; ++i) {
      PyObject* item = items[i];
      int overflow = 0;
      long long v;
      if (PyLong_Check(item)) {
        v = PyLong_AsLongLongAndOverflow(item, &overflow);
      } else {
        PyObject* index = PyIndex_Check(item) ? PyNumber_Index(item) : nullptr;
        if (index == nullptr) {
          PyErr_Clear();
          TORCH_CHECK_TYPE(false, op, ": row ", r, " holds a ", Py_TYPE(item)->tp_name, " at ", i,
                           "; ids must be integers");
        }
        v = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
      }
      if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        TORCH_CHECK_VALUE(false, op, ": row ", r, " holds an integer at ", i, " that does not fit in int64");
      }
      dst[i] = static_cast<int64_t>(v);
    }
    std::fill(dst + len, dst + seq, pad_value);
  }
  return out;
}

}  // namespace fastbert
