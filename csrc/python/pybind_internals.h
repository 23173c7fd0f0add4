#pragma once

// The binding's uses of pybind11 internals (py::detail), gathered here:
// reading an instance's C++ object without a cast (the raw CPython methods
// of the hot paths) and telling whether one was ever initialised.
// test/python/test_reliability_monitors.py fails loudly if a pybind11
// upgrade changes what these rely on (objects made with __new__ alone must
// raise TypeError, pickling must round-trip).

#include <pybind11/pybind11.h>

namespace torch_monitor::python {

// The C++ object of a pybind11 instance of a single registered class;
// nullptr when it was never initialised (made with __new__ alone).
inline void* cppObjectOf(PyObject* obj) {
  auto* inst = reinterpret_cast<pybind11::detail::instance*>(obj);
  return inst->simple_layout
      ? inst->simple_value_holder[0]
      : pybind11::detail::values_and_holders(inst).begin()->value_ptr();
}

// Makes every attribute lookup on an uninitialised instance of `cls` raise
// TypeError instead of reaching methods that would dereference its missing
// C++ object (pybind11 does not check). Costs one pointer test per lookup.
// The class must use plain (generic) attribute lookup otherwise.
void refuseUninitialisedUse(pybind11::handle cls);

} // namespace torch_monitor::python
