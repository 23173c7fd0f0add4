#include <torch_monitor/event.h>

#include <c10/util/Exception.h>

namespace torch_monitor {

std::chrono::time_point<std::chrono::system_clock> fromEpochMicros(
    int64_t micros) {
  TORCH_CHECK_VALUE(
      micros >= kMinEpochMicros && micros <= kMaxEpochMicros,
      "timestamp ",
      micros,
      " µs since 1970 is outside the supported range, 1677-09-21 to "
      "2262-04-11 UTC (what a std::chrono::system_clock time point holds)");
  return std::chrono::time_point<std::chrono::system_clock>(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::microseconds(micros)));
}

} // namespace torch_monitor
