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

#include <sys/types.h>

#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/detail/lifecycle.h>
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
  // Bytes a file starts with once opened (given its path; may be empty):
  // a TensorBoard file's version record, or the newline that a JSON Lines
  // file appended to needs when another program left its last line open.
  std::function<std::string(const std::string& path)> header;
  // Given buffered data that starts at a record boundary, the offset just
  // past the record that contains byte `pos`. The writer walks records with
  // it (pos 0 of the data from a boundary on): to find where a failed write
  // must be cut back to, to count the records it could not write (dropped()
  // counts records: JSON Lines lines, i.e. events; TensorBoard records, i.e.
  // points), and to skip the rest of a record cut short in a pipe when a
  // file must be replaced.
  std::function<size_t(std::string_view data, size_t pos)> recordEnd;
  // O_EXCL (a fresh file per open, as TensorBoard wants) or O_APPEND.
  bool exclusive = false;
  // Truncate the first file opened (a JSON Lines file with append=false).
  bool truncateFirst = false;
  // Called before each write of the buffer (on the flusher thread or the
  // thread calling flush() or close(), without the writer's locks) so that
  // a format can append() records it could not encode when they were
  // offered (TensorBoardWriter reads device values there); `closing` on the
  // last call, from close(). May be empty.
  std::function<void(bool closing)> beforeWrite;
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
// process exit).
//
// A regular file always ends at a record boundary: when a write stops
// part-way through a record (a full disk, a file size limit), the part that
// reached the file is cut off again (ftruncate, file offset moved back) and
// the whole record waits in memory for the retry. A pipe or FIFO cannot be
// cut: there the rest of that record is written first on retry, so the
// stream stays a sequence of records.
//
// Faults never reach the producer: a directory that cannot be created, a
// file that cannot be opened or written, or a file that vanished are
// reported once each (ProblemLog) and retried every flushInterval (a
// vanished file is re-created, with the header); records wait in memory,
// and past maxBufferBytes new ones are dropped and counted.
//
// Every record that is never written is counted in dropped(): those over
// the bound, those still unwritten at close() (and so at process exit; the
// report also gives the bytes), those buffered when a pipe's reader went
// away and every one after it, and those offered in a forked child. The
// header (the first bytes of each file) is not a record of the caller's and
// is never counted.
//
// Paths that are not regular files (a FIFO, /dev/stdout on a pipe, a
// character device) never block: they are opened and written with
// O_NONBLOCK. A FIFO that no process reads yet cannot be opened (reported,
// retried like any open failure); a reader that does not keep up leaves
// records in memory until the next flush (the bound then drops, reported
// once); a reader that went away (EPIPE) ends the output: reported once,
// and every later record is dropped and counted. Their writes run with
// SIGPIPE blocked (writeWithoutSigpipe), so a closed pipe never kills the
// process; regular files are written plainly, with no extra system call.
//
// In a child created by fork() an inherited writer is inert: the flusher
// thread and the file stay with the process that made the writer, the
// parent's buffered records are never written by the child, and the first
// record offered in the child is reported once (then ignored). Writers
// made in the child work normally. The one lock a child may still take
// (mutex_, via currentPath()) is held across fork() (ForkSafeLocks).
// Thread safety: start() once, by its owner; then every method from any
// thread, concurrently with each other and with the flusher thread.
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
  // the buffer is over its bound, the pipe's reader went away, or in a
  // forked child (reported once); ignored once closed.
  template <typename Encode>
  void append(Encode&& encode) {
    if (torch_monitor::detail::forkGeneration() != generation_) {
      // The parent's writer: nothing is written here. Encoded only to count
      // the records (mutex_ is whole in a child: it is held across fork()).
      std::string discarded;
      size_t records = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (closed_) {
          return;
        }
        records = encode(discarded);
      }
      dropped_.fetch_add(
          static_cast<int64_t>(records), std::memory_order_relaxed);
      reportForkedChild();
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_) {
      return;
    }
    const size_t before = buffer_.size();
    const size_t records = encode(buffer_);
    const bool outputGone = outputGone_;
    if (outputGone || buffer_.size() + pendingBytes_ > maxBufferBytes_) {
      buffer_.resize(before);
      const bool first = records > 0 &&
          dropped_.fetch_add(
              static_cast<int64_t>(records), std::memory_order_relaxed) == 0;
      lock.unlock();
      if (first && !outputGone) {
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
  // Asks the flusher thread to write now instead of at its next interval.
  void requestFlush();
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
  // Flushes every live writer on the calling thread (they stay open): the
  // Python exit sequence writes what is buffered while a failure can still
  // become a Python warning.
  static void flushAll();

  // How long close() waits for the reader of a pipe or FIFO to take what is
  // left before reporting it lost (close and process exit never hang on a
  // stalled reader).
  static constexpr std::chrono::milliseconds kCloseDrainTimeout{1000};

  // Test hook: while non-zero, every write fails with this errno (as a full
  // disk would, with ENOSPC) without touching the file. (A write that stops
  // part-way is made real with a file size limit, RLIMIT_FSIZE.)
  static void setWriteErrorForTesting(int error);

 private:
  using Deadline = std::chrono::steady_clock::time_point;

  void run();
  void wakeFlusher();
  void reportDropped();
  void reportForkedChild();
  // With ioMutex_ held. A pipe that is full is waited for until
  // `waitForReader` (the default: not at all; close() passes a deadline).
  void flushLocked(bool openEvenIfIdle, Deadline waitForReader = Deadline());
  int writePending(Deadline waitForReader);
  // After a failed write: drops the records written whole from pending_ and,
  // in a regular file, cuts off the part of the next one that reached it,
  // so that pending_ starts with the first record not (wholly) in the file
  // and written_ is what of it is (0 unless the file could not be cut).
  void keepWholeRecords();
  // The offset of the record boundary at or before `pos` in pending_.
  size_t recordStart(size_t pos) const;
  // The records in `data` (which starts at a record boundary).
  size_t countRecords(std::string_view data) const;
  // Forgets pending_ (which starts at a record boundary) and counts its
  // records, but for a header not yet written, in dropped_; returns them.
  size_t dropPending();
  void endOutput();
  bool ensureFile();
  bool openNextFile();
  void reportOpenFailure(const std::string& path, int error);
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
  bool outputGone_ = false; // the reader of a pipe left: records are dropped
  std::string path_;
  std::atomic<int64_t> dropped_{0};
  // The process that made this writer, and the fork generation of the last
  // child that reported receiving records (each child reports once).
  const pid_t creatorPid_;
  std::atomic<uint64_t> reportedChild_;

  // I/O side, guarded by ioMutex_ (the flusher thread or a flush() caller).
  std::mutex ioMutex_;
  std::string pending_; // records taken from buffer_
  size_t written_ = 0; // bytes of pending_ already in the file
  // The file's header at the front of pending_, not yet (wholly) written: a
  // record boundary, but no record of the caller's (never counted).
  size_t headerBytes_ = 0;
  int fd_ = -1;
  bool regularFile_ = true; // else writes guard against SIGPIPE
  bool openedOnce_ = false;

  // A forked child never reaches ioMutex_ or closeMutex_ (the writer is
  // inert there), so only mutex_ is kept consistent across fork().
  std::mutex closeMutex_; // a second close() waits for the first
  std::unique_ptr<std::thread> thread_;
  torch_monitor::detail::ForkSafeLocks forkLocks_{
      torch_monitor::detail::ForkLockMode::kInner, {&mutex_}};
};

} // namespace torch_monitor::sinks::detail
