#pragma once

// What a watch does when an observation holds NaN or inf, besides counting
// it: the "torch_monitor.NonFinite" event (always), then nothing more, a
// warning, or an error, from the step change after the step it happened in
// (docs/watch.md, "Non-finite values").

#include <cstdint>
#include <string>
#include <string_view>

#include <torch_monitor/export.h>

namespace torch_monitor::watch {

enum class OnNonFinite : int8_t {
  Log, // the event only
  Warn, // the event, then a warning naming the keys and their steps
  Raise, // the event, then an error naming them (see raiseNonFinite)
};
// "log", "warn", "raise".
TORCH_MONITOR_API std::string_view onNonFiniteName(OnNonFinite action) noexcept;
// The action named so; c10::ValueError naming the three otherwise.
TORCH_MONITOR_API OnNonFinite onNonFiniteFromName(std::string_view name);

// Throws the error of OnNonFinite::Raise: c10::Error in C++ and
// TorchScript, or what the language binding set (Python: FloatingPointError).
[[noreturn]] TORCH_MONITOR_API void raiseNonFinite(const std::string& message);
// Set once by a language binding when it loads; `raise` must throw.
// Thread safety: set before any watch exists; raiseNonFinite on any thread.
TORCH_MONITOR_API void setNonFiniteRaiser(void (*raise)(const std::string&));

} // namespace torch_monitor::watch
