#include "py_common.h"
#include "internals.h"

#include <cstdio>
#include <string>

#include <torch_monitor/detail/text.h>

namespace torch_monitor::python {
namespace {

std::string typeName(py::handle obj) {
  return Py_TYPE(obj.ptr())->tp_name;
}

} // namespace

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
