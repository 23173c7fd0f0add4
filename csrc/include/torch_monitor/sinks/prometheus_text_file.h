#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>
#include <torch_monitor/sinks/format/prometheus.h>
#include <torch_monitor/sinks/sink.h>

namespace torch_monitor::sinks {

// Writes what PrometheusExporter would serve to `path` (a .prom file for
// node_exporter's textfile collector) on every Stat window close: the text
// goes to a temporary file in the same directory, then rename(2) replaces
// `path`, so a reader sees the old file or the new one, never a part.
// (Atomic for readers; not fsync'ed, so not durable across a power loss.)
// A failing write (a full disk) leaves `path` as it was (the temporary file
// is removed), is warned about once (problems()), counts the window event
// that could not be written in dropped(), and is retried at the next
// window; found while handling an event (on whichever thread closed the
// window), it goes to the background warning sink (Python: a
// RuntimeWarning), as the other sinks' faults do. Throws c10::ValueError for
// a path that is empty, ends in '/', is an existing directory, or is not
// UTF-8 without NUL.
// Thread safety: no concurrent call to any API of this type causes a data
// race; handle() may run on many threads at once.
class TORCH_MONITOR_API PrometheusTextFile final : public Sink {
 public:
  explicit PrometheusTextFile(
      std::string path,
      std::map<std::string, std::string> labels = {});
  ~PrometheusTextFile() override;

  void handle(const Event& event) override;
  // Window events whose exposition could not be written.
  int64_t dropped() const override {
    return dropped_.load(std::memory_order_relaxed);
  }

  const std::string& path() const noexcept {
    return path_;
  }
  const std::map<std::string, std::string>& labels() const noexcept {
    return labels_;
  }

 private:
  // Writes the current snapshot; `writeMutex_` held. Failures are warned
  // about `via` there; returns whether `path` now holds it.
  bool writeLocked(ProblemLog::WarnVia via);

  const std::string path_;
  // The file replaced at each window: path_, or the file a link there
  // names (renaming over the link would replace the link).
  std::string target_;
  const std::map<std::string, std::string> labels_;
  const prometheus::Labels checked_;
  prometheus::Snapshot snapshot_;
  std::mutex writeMutex_; // one writer of the temporary file at a time
  std::atomic<int64_t> dropped_{0};
  torch_monitor::detail::ForkSafeLocks forkLocks_{
      torch_monitor::detail::ForkLockMode::kResetInChild, {&writeMutex_}};
};

} // namespace torch_monitor::sinks
