#include <torch_monitor/sinks/memory_handler.h>

#include <c10/util/Exception.h>

namespace torch_monitor::sinks {

MemoryHandler::MemoryHandler(size_t capacity, std::vector<std::string> eventNames)
    : Sink("MemoryHandler(capacity=" + std::to_string(capacity) + ")"),
      capacity_(capacity),
      filter_(std::move(eventNames)) {
  TORCH_CHECK_VALUE(
      capacity > 0, "MemoryHandler: capacity must be at least 1, got 0");
}

MemoryHandler::~MemoryHandler() {
  close();
}

void MemoryHandler::handle(const Event& event) {
  if (closed() || !filter_.accepts(event.name)) {
    return;
  }
  Event copy = event; // allocate outside the lock
  std::lock_guard<std::mutex> guard(mutex_);
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(copy));
    return;
  }
  ring_[next_] = std::move(copy);
  next_ = (next_ + 1) % capacity_;
  ++overwritten_;
}

std::vector<Event> MemoryHandler::events() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<Event> out;
  out.reserve(ring_.size());
  // Once full, next_ is the oldest slot.
  for (size_t i = 0; i < ring_.size(); ++i) {
    out.push_back(ring_[(next_ + i) % ring_.size()]);
  }
  return out;
}

void MemoryHandler::clear() {
  std::lock_guard<std::mutex> guard(mutex_);
  ring_.clear();
  next_ = 0;
}

size_t MemoryHandler::size() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return ring_.size();
}

int64_t MemoryHandler::dropped() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return overwritten_;
}

} // namespace torch_monitor::sinks
