#include <torch_monitor/wait_counter.h>

#include <exception>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/text.h>

namespace torch_monitor {

void WaitCounter::Guard::stop() {
  if (counter_ == nullptr) {
    return;
  }
  WaitCounter* counter = counter_;
  counter_ = nullptr; // recorded once, even if a handler throws
  counter->record(std::chrono::steady_clock::now() - start_);
}

WaitCounter::Guard::~Guard() {
  // A destructor must not throw (it may run while an exception unwinds the
  // timed work); the unit is recorded either way.
  try {
    stop();
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: an event handler failed while a WaitCounter guard "
        "recorded its unit of work: ",
        detail::errorMessage(e));
  } catch (...) {
    TORCH_WARN(
        "torch_monitor: an event handler failed while a WaitCounter guard "
        "recorded its unit of work");
  }
}

} // namespace torch_monitor
