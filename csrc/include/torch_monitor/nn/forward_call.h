#pragma once

// What a C++ forward hook sees of one forward() call: type-erased views of the
// arguments and of the result. Kept free of torch headers: the views only
// point at objects that live in torch_monitor::nn::call's frame.

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <c10/util/Exception.h>

#include <torch_monitor/export.h>

namespace torch_monitor::nn {

namespace detail {

// One argument or result, seen through a pointer and its type. `isConst`
// records whether the caller handed it over const (then hooks may not write).
// Thread safety: a plain value; what it points to is the caller's.
struct ErasedRef {
  const void* ptr = nullptr;
  const std::type_info* type = nullptr;
  bool isConst = true;

  template <typename T>
  static ErasedRef of(T&& value) noexcept {
    using Bare = std::remove_cv_t<std::remove_reference_t<T>>;
    return ErasedRef{
        // const_cast only drops `volatile` (hooks read through the view).
        static_cast<const void*>(const_cast<const Bare*>(std::addressof(value))),
        &typeid(Bare),
        std::is_const_v<std::remove_reference_t<T>>};
  }
};

// Demangled name of a type, for error messages (out of line: cold path).
TORCH_MONITOR_API std::string typeName(const std::type_info& type);

} // namespace detail

// The arguments of a forward() call, as the caller passed them to
// torch_monitor::nn::call. Read-only: a C++ pre-hook observes the inputs but
// cannot replace them (forward() receives exactly what the caller passed).
// Types are compared without references and cv-qualifiers: an argument passed
// as `const torch::Tensor&` is read with get<torch::Tensor>(i).
// Thread safety: a view valid only during the hook call that received it;
// do not keep it or hand it to another thread.
class ForwardArgs {
 public:
  ForwardArgs() noexcept = default;
  ForwardArgs(const detail::ErasedRef* refs, std::size_t size) noexcept
      : refs_(refs), size_(size) {}

  std::size_t size() const noexcept {
    return size_;
  }

  // The type of argument `i` (without reference and cv-qualifiers).
  const std::type_info& type(std::size_t i) const {
    checkIndex(i);
    return *refs_[i].type;
  }

  // Argument `i` if it exists and is a T, else nullptr.
  template <typename T>
  const T* getIf(std::size_t i) const noexcept {
    if (i >= size_ || *refs_[i].type != typeid(T)) {
      return nullptr;
    }
    return static_cast<const T*>(refs_[i].ptr);
  }

  // Argument `i` as a T; c10::IndexError / c10::TypeError otherwise.
  template <typename T>
  const T& get(std::size_t i) const {
    checkIndex(i);
    const T* value = getIf<T>(i);
    TORCH_CHECK_TYPE(
        value != nullptr,
        "torch_monitor: forward argument ", i, " is a ",
        detail::typeName(*refs_[i].type), ", not a ",
        detail::typeName(typeid(T)),
        "; read it with get<", detail::typeName(*refs_[i].type),
        ">(", i, ") or check with getIf/type first");
    return *value;
  }

 private:
  void checkIndex(std::size_t i) const {
    TORCH_CHECK_INDEX(
        i < size_, "torch_monitor: forward argument ", i,
        " does not exist; this forward() call has ", size_,
        " argument(s) (see size())");
  }

  const detail::ErasedRef* refs_ = nullptr;
  std::size_t size_ = 0;
};

// The value forward() returned, seen by forward (post) hooks. A hook may
// modify it in place (e.g. `output.get<torch::Tensor>() = y * 2`); the
// modified value is what torch_monitor::nn::call returns. Empty when forward()
// returns void.
// Thread safety: a view valid only during the hook call that received it;
// do not keep it or hand it to another thread.
class ForwardOutput {
 public:
  ForwardOutput() noexcept = default;
  explicit ForwardOutput(detail::ErasedRef ref) noexcept : ref_(ref) {}

  bool hasValue() const noexcept {
    return ref_.ptr != nullptr;
  }

  // The type of the result (without reference and cv-qualifiers).
  const std::type_info& type() const {
    checkValue();
    return *ref_.type;
  }

  // The result if it is a T, else nullptr.
  template <typename T>
  const T* getIf() const noexcept {
    if (ref_.ptr == nullptr || *ref_.type != typeid(T)) {
      return nullptr;
    }
    return static_cast<const T*>(ref_.ptr);
  }
  // Writable access; nullptr also when forward() returned a const reference.
  template <typename T>
  T* getIf() noexcept {
    if (ref_.isConst) {
      return nullptr;
    }
    // The object is not const (checked above); the pointer was only stored
    // as const void* to share ErasedRef with the read-only arguments.
    return const_cast<T*>(std::as_const(*this).template getIf<T>());
  }

  template <typename T>
  const T& get() const {
    checkValue();
    const T* value = getIf<T>();
    TORCH_CHECK_TYPE(
        value != nullptr, "torch_monitor: forward() returned a ",
        detail::typeName(*ref_.type), ", not a ", detail::typeName(typeid(T)),
        "; read it with get<", detail::typeName(*ref_.type), ">()");
    return *value;
  }
  template <typename T>
  T& get() {
    const T& value = std::as_const(*this).template get<T>();
    TORCH_CHECK_TYPE(
        !ref_.isConst,
        "torch_monitor: forward() returned a const reference to ",
        detail::typeName(*ref_.type),
        "; a hook can only read it (use a const ForwardOutput&)");
    return const_cast<T&>(value);
  }

 private:
  void checkValue() const {
    TORCH_CHECK_VALUE(
        ref_.ptr != nullptr,
        "torch_monitor: this forward() returns void, so there is no output "
        "to read; check hasValue() first");
  }

  detail::ErasedRef ref_;
};

} // namespace torch_monitor::nn
