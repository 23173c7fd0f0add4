#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

#include <torch_monitor/export.h>

namespace torch_monitor::watch {

// The device caching allocator's counters for `device`, as a watch's event
// carries them with memory=True: "cuda.memory.allocated", ".reserved",
// ".peak_allocated" (bytes; the peak since the program started or last
// reset it, torch.cuda.max_memory_allocated), ".alloc_retries" and ".ooms"
// (counts since then). Read through c10's device-generic allocator
// interface, so this library does not link CUDA. Empty for a device that is
// not CUDA or whose allocator keeps no statistics. Reads host-side
// counters only: no synchronisation with the device.
// Thread safety: callable from any thread.
TORCH_MONITOR_API std::vector<std::pair<std::string, int64_t>>
deviceMemoryStats(c10::Device device);

// The names above, in that order (what ranks merge: the first three by
// their maximum over ranks, the counts by their sum).
TORCH_MONITOR_API const std::vector<std::string>& deviceMemoryStatNames();

} // namespace torch_monitor::watch
