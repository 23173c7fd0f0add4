#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>
#include <torch_monitor/sinks/rank_files.h>
#include <torch_monitor/sinks/sink.h>

namespace torch_monitor::sinks {

// Configuration of a JsonLinesWriter; a plain value.
struct JsonLinesWriterOptions {
  std::chrono::milliseconds flushInterval{1000};
  size_t maxBufferBytes = size_t(32) << 20;
  // Events written; empty = every event.
  std::vector<std::string> eventNames;
  // Append to an existing file (default) or start it anew.
  bool append = true;
  // In a distributed job (process_rank.h): each rank writes to its own
  // file, "<dir>/rank<r>/<name>" for path "<dir>/<name>", or only rank 0
  // writes, to path. A FIFO or device path is shared as given.
  RankFiles ranks = RankFiles::Separate;
};

// Writes one JSON object per event and line (JSON Lines):
//   {"name":"torch.monitor.Stat","timestamp":"2024-05-01T12:34:56.123456Z",
//    "epoch_seconds":1714566896.123456,"step":1200,
//    "data":{"loss.mean":0.25,"n":3}}
// "step" (an integer) is there only when the event has a step (a Stat's
// event has one once the training loop calls setStep); "rank" and
// "world_size" only in a distributed job (distributedRank(), read per
// event), whose ranks write separate files by default (options.ranks).
// Types are kept: ints as JSON integers, doubles as numbers that always
// read back as floats (NaN/Infinity as the strings "NaN", "Infinity",
// "-Infinity"), bools as true/false, strings as strings. Any name, key or
// string is escaped and invalid UTF-8 replaced by U+FFFD, so every line is
// valid JSON. Buffered and written in the background exactly like
// TensorBoardWriter (the same BufferedFileWriter); the parent directory is
// created if missing.
// Thread safety: no concurrent call to any API of this type causes a data
// race; handle() may run on many threads at once.
class TORCH_MONITOR_API JsonLinesWriter final : public Sink {
 public:
  explicit JsonLinesWriter(
      std::string path,
      JsonLinesWriterOptions options = JsonLinesWriterOptions());
  ~JsonLinesWriter() override;

  void handle(const Event& event) override;
  void flush() override;
  // Events (lines) that were never written: over the buffer bound, still
  // unwritten at close or exit (a full disk), or after a pipe's reader left.
  int64_t dropped() const override;

  // The path as given (what is saved with a TorchScript module).
  const std::string& path() const noexcept;
  const JsonLinesWriterOptions& options() const noexcept;
  // The file this process writes: path, or its per-rank path in a
  // distributed job; "" on a rank that writes nothing (RankFiles::Zero).
  const std::string& filePath() const noexcept;

 protected:
  void closeOutput() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace torch_monitor::sinks
