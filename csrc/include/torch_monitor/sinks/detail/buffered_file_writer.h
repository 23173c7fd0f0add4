#pragma once

// The buffering and background flushing shared by the file sinks
// (TensorBoardWriter, JsonLinesWriter). Not part of the stable API.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include <torch_monitor/export.h>
#include <torch_monitor/sinks/sink.h>

namespace torch_monitor::sinks::detail {

// What the writer needs to know about the files of one format; the
// functions are called on the flusher thread or a flush() caller, one at a
// time.
struct FileLayout {
  // Path of the next file to open: the first one, and a replacement when
  // the current file vanished (its directory was removed, say).
  std::function<std::string()> nextPath;
  // Bytes every new file starts with (may return an empty string).
  std::function<std::string()> header;
  // Given buffered data that starts at a record boundary, the offset just
  // past the record that contains byte `pos` (used to skip the unwritten
  // rest of a record when a file must be replaced mid-record).
  std::function<size_t(std::string_view data, size_t pos)> recordEnd;
  // O_EXCL (a fresh file per open, as TensorBoard wants) or O_APPEND.
  bool exclusive = false;
  // Truncate the first file opened (a JSON Lines file with append=false).
  bool truncateFirst = false;
};

// Flush interval and memory bound; a plain value.
struct BufferOptions {
  std::chrono::milliseconds flushInterval{1000};
  // Bound on the bytes held in memory (appended plus not yet written);
  // beyond it new records are dropped and counted.
  size_t maxBufferBytes = size_t(32) << 20;
};

// Appends whole records to an in-memory buffer on the caller's thread and
// writes them to a file on a background thread every flushInterval, or
// sooner when the buffer fills (and on flush(), close(), destruction and
// process exit). The file only ever receives whole records, except when a
// write fails half-way: then the rest of that record is written first on
// retry, so the file stays a sequence of records.
//
// Faults never reach the producer: a directory that cannot be created, a
// file that cannot be opened or written, or a file that vanished are
// reported once each (ProblemLog) and retried every flushInterval (a
// vanished file is re-created, with the header); records wait in memory,
// and past maxBufferBytes new ones are dropped and counted.
//
// In a child created by fork() the writer is inert: the child has no
// flusher thread and shares the parent's file descriptor.
// Thread safety: no concurrent call to any API of this type causes a data
// race; append() may run on many threads at once.
class TORCH_MONITOR_API BufferedFileWriter {
 public:
  BufferedFileWriter(
      FileLayout layout,
      BufferOptions options,
      ProblemLog& problems);
  ~BufferedFileWriter(); // close()
  BufferedFileWriter(const BufferedFileWriter&) = delete;
  BufferedFileWriter& operator=(const BufferedFileWriter&) = delete;

  // Opens the first file now, so that a bad directory is reported by the
  // constructor's caller, then starts the flusher thread.
  void start();

  // Runs `encode(std::string& buffer)` under the buffer lock. It appends
  // whole records and returns how many (size_t). Dropped (and counted) when
  // the buffer is over its bound; ignored once closed.
  template <typename Encode>
  void append(Encode&& encode) {
    if (forkGeneration().load(std::memory_order_relaxed) != generation_) {
      return; // forked child: the mutex may be held by a parent thread
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_) {
      return;
    }
    const size_t before = buffer_.size();
    const size_t records = encode(buffer_);
    if (buffer_.size() + pendingBytes_ > maxBufferBytes_) {
      buffer_.resize(before);
      const bool first = records > 0 &&
          dropped_.fetch_add(
              static_cast<int64_t>(records), std::memory_order_relaxed) == 0;
      lock.unlock();
      if (first) {
        reportDropped(); // ProblemLog dedupes too, but not for free
      }
      return;
    }
    if (buffer_.size() >= flushThreshold_ && !flushRequested_) {
      flushRequested_ = true;
      lock.unlock();
      wakeFlusher();
    }
  }

  // Writes everything appended so far, on the calling thread.
  void flush();
  // Flushes, stops the flusher thread and closes the file. Idempotent.
  void close();

  int64_t dropped() const noexcept {
    return dropped_.load(std::memory_order_relaxed);
  }
  // The file being written ("" before one could be opened).
  std::string currentPath() const;

  // Closes every live writer (flush, join, close). Runs at process exit from
  // a static destructor; callable earlier (e.g. by an atexit hook).
  static void closeAll();

  // Test hook: while non-zero, every write fails with this errno (as a full
  // disk would, with ENOSPC) without touching the file.
  static void setWriteErrorForTesting(int error);

  // Bumped in the child of every fork().
  static std::atomic<uint64_t>& forkGeneration() noexcept;

 private:
  void run();
  void wakeFlusher();
  void reportDropped();
  // With ioMutex_ held:
  void flushLocked(bool openEvenIfIdle);
  bool ensureFile();
  bool openNextFile();
  bool fileStillThere() const;
  std::string bufferedNote() const;

  const FileLayout layout_;
  const BufferOptions options_;
  ProblemLog& problems_;
  const uint64_t generation_;
  const size_t maxBufferBytes_;
  const size_t flushThreshold_;

  // Producer side, guarded by mutex_.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::string buffer_;
  size_t pendingBytes_ = 0; // bytes taken by the flusher, not yet written
  bool flushRequested_ = false;
  bool stop_ = false;
  bool closed_ = false;
  std::string path_;
  std::atomic<int64_t> dropped_{0};

  // I/O side, guarded by ioMutex_ (the flusher thread or a flush() caller).
  std::mutex ioMutex_;
  std::string pending_; // records taken from buffer_
  size_t written_ = 0; // bytes of pending_ already in the file
  int fd_ = -1;
  bool openedOnce_ = false;

  std::mutex closeMutex_; // a second close() waits for the first
  std::unique_ptr<std::thread> thread_;
};

} // namespace torch_monitor::sinks::detail
