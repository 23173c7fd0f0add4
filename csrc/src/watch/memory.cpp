#include <torch_monitor/watch/memory.h>

#include <exception>

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

namespace torch_monitor::watch {

const std::vector<std::string>& deviceMemoryStatNames() {
  static const std::vector<std::string> names = {
      "cuda.memory.allocated",
      "cuda.memory.reserved",
      "cuda.memory.peak_allocated",
      "cuda.memory.alloc_retries",
      "cuda.memory.ooms",
  };
  return names;
}

std::vector<std::pair<std::string, int64_t>> deviceMemoryStats(
    c10::Device device) {
  if (device.type() != c10::DeviceType::CUDA) {
    return {};
  }
  try {
    // c10::GetAllocator throws when no CUDA allocator is registered (a CPU
    // build of torch); the cast fails for an allocator without statistics.
    auto* allocator = dynamic_cast<c10::DeviceAllocator*>(
        c10::GetAllocator(c10::DeviceType::CUDA));
    if (allocator == nullptr || !allocator->initialized()) {
      return {};
    }
    const auto stats = allocator->getDeviceStats(
        device.has_index() ? device.index() : c10::DeviceIndex(0));
    constexpr auto all =
        static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const auto& names = deviceMemoryStatNames();
    return {
        {names[0], stats.allocated_bytes[all].current},
        {names[1], stats.reserved_bytes[all].current},
        {names[2], stats.allocated_bytes[all].peak},
        {names[3], stats.num_alloc_retries},
        {names[4], stats.num_ooms},
    };
  } catch (const std::exception&) {
    return {};
  }
}

} // namespace torch_monitor::watch
