#include "py_common.h"
#include "internals.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include <torch/csrc/autograd/python_variable.h>

#include <torch_monitor/detail/text.h>

namespace torch_monitor::python {
namespace {

std::string typeName(py::handle obj) {
  return Py_TYPE(obj.ptr())->tp_name;
}

} // namespace

bool fastCallArgumentsByKeyword(
    const char* method,
    std::initializer_list<const char*> names,
    PyObject* const* args,
    Py_ssize_t nargs,
    PyObject* kwnames,
    PyObject** out) {
  const auto n = static_cast<Py_ssize_t>(names.size());
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  std::fill(out, out + n, nullptr);
  bool ok = nargs + nkw == n;
  for (Py_ssize_t i = 0; ok && i < nargs; ++i) {
    out[i] = args[i];
  }
  for (Py_ssize_t k = 0; ok && k < nkw; ++k) {
    PyObject* keyword = PyTuple_GET_ITEM(kwnames, k);
    Py_ssize_t slot = 0;
    for (const char* name : names) {
      if (PyUnicode_CompareWithASCIIString(keyword, name) == 0) {
        break;
      }
      ++slot;
    }
    ok = slot < n && out[slot] == nullptr;
    if (ok) {
      out[slot] = args[nargs + k];
    }
  }
  if (ok) {
    return true;
  }
  std::string signature;
  for (const char* name : names) {
    signature += (signature.empty() ? "" : ", ") + std::string(name);
  }
  PyErr_Format(
      PyExc_TypeError,
      "%s(%s) takes those %zd argument(s), by position or keyword; got %zd "
      "positional and %zd keyword (%R)",
      method,
      signature.c_str(),
      n,
      nargs,
      nkw,
      kwnames == nullptr ? Py_None : kwnames);
  return false;
}

at::Tensor tensorFromPython(py::handle obj, const std::string& what) {
  // c10's TypeError: a raw hook's caller (setPythonError) keeps its type.
  TORCH_CHECK_TYPE(
      THPVariable_Check(obj.ptr()),
      what,
      " must be a torch.Tensor, got ",
      Py_TYPE(obj.ptr())->tp_name);
  return THPVariable_Unpack(obj.ptr());
}

std::string textFromPython(py::handle obj, const std::string& what) {
  PyObject* o = obj.ptr();
  if (PyUnicode_Check(o)) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(o, &size);
    const Py_ssize_t length = PyUnicode_GET_LENGTH(o);
    if (data == nullptr) {
      // Only lone surrogates (from surrogateescape/surrogatepass decoding or
      // "\udc80" literals) make a str unencodable.
      PyErr_Clear();
      Py_ssize_t at = 0;
      Py_UCS4 c = 0;
      for (; at < length; ++at) {
        c = PyUnicode_ReadChar(o, at);
        if (c >= 0xD800 && c <= 0xDFFF) {
          break;
        }
      }
      char code[16];
      std::snprintf(code, sizeof(code), "U+%04X", static_cast<unsigned>(c));
      throw py::value_error(
          what + " is not valid UTF-8: it holds the lone surrogate " + code +
          " at index " + std::to_string(at) +
          " (undecodable bytes kept by errors='surrogateescape'?); decode "
          "the bytes with errors='replace' or pass valid text");
    }
    const Py_ssize_t nul = PyUnicode_FindChar(o, 0, 0, length, 1);
    if (nul >= 0) {
      throw py::value_error(
          what + " contains a NUL character at index " + std::to_string(nul) +
          "; names and text values must not contain NUL");
    }
    return std::string(data, size);
  }
  if (PyBytes_Check(o)) {
    std::string text(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
    detail::checkText(text, what);
    return text;
  }
  throw py::type_error(what + " must be a str, got " + typeName(obj));
}

PyRef::~PyRef() {
  if (pythonIsUsable()) {
    py::gil_scoped_acquire gil;
    object_ = py::object();
  } else {
    object_.release(); // the interpreter is gone; leak the reference
  }
}

} // namespace torch_monitor::python
