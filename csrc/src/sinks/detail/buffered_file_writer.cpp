#include <torch_monitor/sinks/detail/buffered_file_writer.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/sinks/detail/open_file.h>
#include <torch_monitor/sinks/detail/write_without_sigpipe.h>

namespace torch_monitor::sinks::detail {
namespace {

std::atomic<int> gWriteErrorForTesting{0};

// Every live writer, so that process exit can flush and join them all: a
// registered sink is owned by the (never destroyed) handler registry, so its
// destructor would never run. Leaked so that it outlives every static.
// closeAll() holds the mutex while writers take their own locks: kOuter.
struct LiveWriters {
  std::mutex mutex;
  std::vector<BufferedFileWriter*> writers;
  torch_monitor::detail::ForkSafeLocks forkLocks{
      torch_monitor::detail::ForkLockMode::kOuter, {&mutex}};
};
LiveWriters& liveWriters() {
  static auto* instance = new LiveWriters();
  return *instance;
}

// Every writer is closed by the last exit stage (lifecycle.h): when the
// library unloads, after the last windows were logged, and before the
// libraries we depend on are finalised (c10's warning machinery stays
// usable).
const bool kClosedAtUnload = [] {
  torch_monitor::detail::onExit(
      torch_monitor::detail::ExitStage::kFileWriters,
      &BufferedFileWriter::closeAll);
  return true;
}();

std::string errorText(int error) {
  return std::string(std::strerror(error)) + " (errno " +
      std::to_string(error) + ")";
}

std::string parentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) {
    return ".";
  }
  return slash == 0 ? "/" : path.substr(0, slash);
}

// mkdir -p; on failure returns false with errno set and `failed` the
// directory that could not be made.
bool makeDirectories(const std::string& dir, std::string& failed) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return true;
    }
    failed = dir;
    errno = ENOTDIR;
    return false;
  }
  const std::string parent = parentOf(dir);
  if (parent != dir && !makeDirectories(parent, failed)) {
    return false;
  }
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) {
    failed = dir;
    return false;
  }
  return true;
}

std::string formatSeconds(std::chrono::milliseconds ms) {
  const double s = static_cast<double>(ms.count()) / 1000.0;
  std::string text = std::to_string(s);
  text.erase(text.find_last_not_of('0') + 1);
  if (!text.empty() && text.back() == '.') {
    text.pop_back();
  }
  return text + " s";
}

} // namespace

BufferedFileWriter::BufferedFileWriter(
    FileLayout layout,
    BufferOptions options,
    ProblemLog& problems)
    : layout_(std::move(layout)),
      options_(options),
      problems_(problems),
      generation_(torch_monitor::detail::forkGeneration()),
      creatorPid_(::getpid()),
      reportedChild_(generation_),
      maxBufferBytes_(options.maxBufferBytes),
      // Wake the flusher early enough that a fast producer rarely meets the
      // bound: a quarter of it, at most 1 MiB per write.
      flushThreshold_(std::min<size_t>(
          size_t(1) << 20,
          std::max<size_t>(options.maxBufferBytes / 4, 1))) {
  TORCH_CHECK_VALUE(
      options_.flushInterval.count() > 0,
      "flush interval must be positive, got ",
      options_.flushInterval.count(),
      " ms");
  TORCH_CHECK_VALUE(
      options_.maxBufferBytes > 0, "max_buffer_bytes must be positive");
  auto& live = liveWriters();
  std::lock_guard<std::mutex> guard(live.mutex);
  live.writers.push_back(this);
}

BufferedFileWriter::~BufferedFileWriter() {
  {
    auto& live = liveWriters();
    std::lock_guard<std::mutex> guard(live.mutex);
    live.writers.erase(
        std::remove(live.writers.begin(), live.writers.end(), this),
        live.writers.end());
  }
  close();
}

void BufferedFileWriter::start() {
  {
    std::lock_guard<std::mutex> io(ioMutex_);
    flushLocked(/*openEvenIfIdle=*/true);
  }
  thread_ = std::make_unique<std::thread>([this] { run(); });
}

void BufferedFileWriter::run() {
  torch_monitor::detail::routeThreadWarningsToBackgroundSink();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, options_.flushInterval, [this] {
      return stop_ || flushRequested_;
    });
    if (stop_) {
      break;
    }
    lock.unlock();
    flush();
    lock.lock();
  }
}

void BufferedFileWriter::wakeFlusher() {
  wake_.notify_one();
}

void BufferedFileWriter::requestFlush() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    flushRequested_ = true;
  }
  wakeFlusher();
}

void BufferedFileWriter::reportDropped() {
  problems_.report(
      "dropped",
      "the in-memory buffer is full (" +
          std::to_string(maxBufferBytes_) +
          " bytes): the output is slower than the events, or failing; newer "
          "events are dropped until it catches up (dropped() counts them; "
          "raise max_buffer_bytes or log less often)",
      // Met in append(), on the thread that handles an event.
      ProblemLog::WarnVia::kBackgroundSink);
}

void BufferedFileWriter::reportForkedChild() {
  const uint64_t generation = torch_monitor::detail::forkGeneration();
  if (reportedChild_.exchange(generation, std::memory_order_relaxed) ==
      generation) {
    return;
  }
  const std::string pid = std::to_string(::getpid());
  problems_.report(
      "forked child " + pid,
      "this writer was made by process " + std::to_string(creatorPid_) +
          " before fork(); its background thread and file stay with that "
          "process, so events logged in this child (pid " + pid +
          ") are dropped here (make a new sink in the child to log from it)",
      ProblemLog::WarnVia::kBackgroundSink);
}

void BufferedFileWriter::flush() {
  if (torch_monitor::detail::forkGeneration() != generation_) {
    return;
  }
  if (layout_.beforeWrite) {
    layout_.beforeWrite(/*closing=*/false);
  }
  std::lock_guard<std::mutex> io(ioMutex_);
  {
    // After close() a flush must not open a new file for leftovers.
    std::lock_guard<std::mutex> guard(mutex_);
    if (closed_) {
      return;
    }
  }
  flushLocked(/*openEvenIfIdle=*/false);
}

void BufferedFileWriter::flushLocked(
    bool openEvenIfIdle,
    Deadline waitForReader) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    flushRequested_ = false;
    if (outputGone_) {
      return; // endOutput() emptied the buffer; nothing is written again
    }
    if (pending_.empty()) {
      pending_.swap(buffer_); // buffer_ gets pending_'s cleared capacity
    } else {
      // An earlier write failed: keep order, the bound held them both.
      pending_.append(buffer_);
      buffer_.clear();
    }
    pendingBytes_ = pending_.size() - written_;
  }
  if (pending_.empty() && !openEvenIfIdle) {
    return;
  }
  if (!ensureFile()) {
    return;
  }
  const int error = writePending(waitForReader);
  if (error == EPIPE) {
    endOutput();
    return;
  }
  if (error != 0 && error != EAGAIN && error != EWOULDBLOCK) {
    problems_.report(
        "write " + std::to_string(error),
        "cannot write to '" + currentPath() + "': " + errorText(error) +
            " (free disk space or fix the device)" + bufferedNote());
  }
  // EAGAIN: a pipe's reader is behind. The rest waits for the next flush;
  // if the reader never catches up, the bound drops (and reports) records.
  std::lock_guard<std::mutex> guard(mutex_);
  pendingBytes_ = pending_.size() - written_;
}

int BufferedFileWriter::writePending(Deadline waitForReader) {
  while (written_ < pending_.size()) {
    const char* data = pending_.data() + written_;
    const size_t size = pending_.size() - written_;
    ssize_t n;
    const int injected = gWriteErrorForTesting.load(std::memory_order_relaxed);
    if (injected != 0) {
      n = -1;
      errno = injected;
    } else if (regularFile_) {
      n = ::write(fd_, data, size); // cannot raise SIGPIPE
    } else {
      n = writeWithoutSigpipe(fd_, data, size);
    }
    if (n >= 0) {
      written_ += static_cast<size_t>(n);
      continue;
    }
    const int error = errno;
    if (error == EINTR) {
      continue;
    }
    if (error == EAGAIN || error == EWOULDBLOCK) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          waitForReader - std::chrono::steady_clock::now());
      if (left.count() > 0) {
        struct pollfd ready {};
        ready.fd = fd_;
        ready.events = POLLOUT;
        ::poll(&ready, 1, static_cast<int>(left.count()));
        continue; // written, or the next write says why not
      }
    }
    keepWholeRecords();
    return error;
  }
  pending_.clear();
  written_ = 0;
  headerBytes_ = 0;
  return 0;
}

void BufferedFileWriter::keepWholeRecords() {
  if (written_ == 0) {
    return;
  }
  const size_t start = recordStart(written_);
  size_t partial = written_ - start;
  if (partial > 0 && regularFile_) {
    // A file must never end inside a record: a reader would see a torn
    // line (or TensorBoard a torn record) if the retry never comes (close
    // on a full disk, a crash). Cut it off; the record is kept whole.
    const int error = truncateLastWrite(fd_, partial);
    if (error == 0) {
      partial = 0;
    } else {
      problems_.report(
          "truncate " + std::to_string(error),
          "cannot cut off the part of a record that a failed write left "
          "at the end of '" +
              currentPath() + "': " + errorText(error) +
              "; the rest of the record is written first on retry");
    }
  }
  pending_.erase(0, start);
  if (start > 0) {
    headerBytes_ = 0; // the header is the first record: it is in the file
  }
  written_ = partial;
}

size_t BufferedFileWriter::recordStart(size_t pos) const {
  const std::string_view data(pending_);
  size_t at = 0;
  while (at < data.size()) {
    const size_t length = layout_.recordEnd(data.substr(at), 0);
    if (length == 0 || at + length > pos) {
      break;
    }
    at += length;
  }
  return std::min(at, pos);
}

size_t BufferedFileWriter::countRecords(std::string_view data) const {
  size_t records = 0;
  size_t at = 0;
  while (at < data.size()) {
    const size_t length = layout_.recordEnd(data.substr(at), 0);
    ++records;
    if (length == 0) {
      break;
    }
    at += length;
  }
  return records;
}

size_t BufferedFileWriter::dropPending() {
  size_t records = countRecords(pending_);
  if (headerBytes_ > 0 && records > 0) {
    --records; // the header is no record of the caller's
  }
  pending_.clear();
  written_ = 0;
  headerBytes_ = 0;
  dropped_.fetch_add(static_cast<int64_t>(records), std::memory_order_relaxed);
  return records;
}

void BufferedFileWriter::endOutput() {
  size_t unwritten = pending_.size() - written_;
  size_t lost = dropPending();
  ::close(fd_);
  fd_ = -1;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    outputGone_ = true;
    // Appended since the write began: lost as well (whole records).
    const size_t records = countRecords(buffer_);
    dropped_.fetch_add(
        static_cast<int64_t>(records), std::memory_order_relaxed);
    lost += records;
    unwritten += buffer_.size();
    buffer_.clear();
    pendingBytes_ = 0;
  }
  problems_.report(
      "reader gone",
      "the reader of '" + currentPath() +
          "' went away (EPIPE: nothing reads the pipe any more); " +
          std::to_string(lost) + " buffered record(s) (" +
          std::to_string(unwritten) +
          " bytes) are lost and further events to this sink are dropped "
          "(dropped() counts them all)");
}

std::string BufferedFileWriter::bufferedNote() const {
  return "; events stay in memory (up to " + std::to_string(maxBufferBytes_) +
      " bytes, then newer ones are dropped) and writing is retried every " +
      formatSeconds(options_.flushInterval);
}

bool BufferedFileWriter::fileStillThere() const {
  struct stat byPath {};
  struct stat byFd {};
  const std::string path = currentPath();
  if (::stat(path.c_str(), &byPath) != 0 || ::fstat(fd_, &byFd) != 0) {
    return false;
  }
  return byPath.st_dev == byFd.st_dev && byPath.st_ino == byFd.st_ino;
}

bool BufferedFileWriter::ensureFile() {
  if (fd_ >= 0 && !fileStillThere()) {
    // Writes would go on "succeeding" into an unlinked file: start anew.
    problems_.report(
        "vanished " + currentPath(),
        "the file '" + currentPath() +
            "' (or its directory) was removed while writing; writing goes on "
            "in a new file");
    ::close(fd_);
    fd_ = -1;
  }
  return fd_ >= 0 || openNextFile();
}

bool BufferedFileWriter::openNextFile() {
  // Exclusive layouts pick a new name when one is taken.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string path = layout_.nextPath();
    std::string failedDir;
    if (!makeDirectories(parentOf(path), failedDir)) {
      const int error = errno;
      problems_.report(
          "mkdir " + failedDir + " " + std::to_string(error),
          "cannot create the directory '" + failedDir +
              "': " + errorText(error) +
              " (fix the path or its permissions)" + bufferedNote());
      return false;
    }
    // O_NONBLOCK: opening a FIFO must not wait for a reader, nor writing
    // to it for the reader to catch up. Regular files drop it below.
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK;
    flags |= layout_.exclusive ? O_EXCL : O_APPEND;
    if (layout_.truncateFirst && !openedOnce_) {
      flags |= O_TRUNC;
    }
    const int fd = openFile(path.c_str(), flags, 0666);
    if (fd < 0) {
      const int error = errno;
      if (error == EEXIST && layout_.exclusive) {
        continue;
      }
      if (error == EINTR) {
        continue;
      }
      reportOpenFailure(path, error);
      return false;
    }
    struct stat st {};
    regularFile_ = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (regularFile_) {
      ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK); // plain writes, as before
    }
    fd_ = fd;
    openedOnce_ = true;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      path_ = path;
    }
    // pending_ starts with the first record not wholly written to the
    // previous file (keepWholeRecords).
    if (headerBytes_ > 0) {
      // The previous file's header: the new file gets its own.
      pending_.erase(0, headerBytes_);
      headerBytes_ = 0;
      written_ = 0;
    } else if (written_ > 0) {
      // The previous file (a pipe, which cannot be cut) got part of a
      // record; the new one starts at the next record boundary.
      const size_t end =
          std::min(layout_.recordEnd(pending_, 0), pending_.size());
      pending_.erase(0, end);
      written_ = 0;
      dropped_.fetch_add(1, std::memory_order_relaxed);
    }
    const std::string header = layout_.header(path);
    pending_.insert(0, header);
    headerBytes_ = header.size();
    return true;
  }
  problems_.report(
      "names exhausted",
      "found no free file name in '" + parentOf(layout_.nextPath()) + "'" +
          bufferedNote());
  return false;
}

void BufferedFileWriter::reportOpenFailure(const std::string& path, int error) {
  struct stat st {};
  if (error == ENXIO && ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)) {
    problems_.report(
        "open " + path + " no reader",
        "cannot open the FIFO '" + path +
            "': no process has it open for reading (start the reader "
            "first)" + bufferedNote());
    return;
  }
  problems_.report(
      "open " + path + " " + std::to_string(error),
      "cannot open '" + path + "' for writing: " + errorText(error) +
          " (fix the path or its permissions)" + bufferedNote());
}

void BufferedFileWriter::close() {
  if (torch_monitor::detail::forkGeneration() != generation_) {
    // A forked child: the flusher thread does not exist here (joining or
    // destroying its handle is undefined), ioMutex_ may have been held by a
    // parent thread at the fork, and the file descriptor and the buffered
    // records are the parent's (written there, never twice).
    // The handle is kept (reachable, so leak checkers stay quiet), never
    // destroyed: destroying a joinable std::thread terminates.
    static auto* orphans = new std::vector<std::unique_ptr<std::thread>>();
    if (thread_ != nullptr) {
      orphans->push_back(std::move(thread_));
    }
    return;
  }
  std::lock_guard<std::mutex> closing(closeMutex_);
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (closed_) {
      return;
    }
  }
  if (layout_.beforeWrite) {
    layout_.beforeWrite(/*closing=*/true); // while appends are still taken
  }
  {
    std::lock_guard<std::mutex> guard(mutex_);
    closed_ = true; // later appends are ignored
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_ != nullptr && thread_->joinable()) {
    thread_->join();
  }
  std::lock_guard<std::mutex> io(ioMutex_);
  flushLocked(
      /*openEvenIfIdle=*/false,
      std::chrono::steady_clock::now() + kCloseDrainTimeout);
  if (written_ < pending_.size()) {
    // Nothing will retry them: each record is counted as dropped. The file
    // ends at a record boundary (keepWholeRecords cut a torn record off).
    const size_t bytes = pending_.size() - written_;
    const bool onlyHeader = headerBytes_ == pending_.size();
    const size_t records = dropPending();
    if (!onlyHeader) {
      // A pipe's or socket's reader had the drain time; a device (/dev/full)
      // refused them, with the write error reported before.
      struct stat st {};
      const bool hasReader = !regularFile_ && fd_ >= 0 &&
          ::fstat(fd_, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
      problems_.report(
          "lost at close",
          std::to_string(records) + " record(s) (" + std::to_string(bytes) +
              " bytes) of events could not be written before close and are "
              "lost (dropped() counts them)" +
              (hasReader ? " (the reader did not take them within " +
                       formatSeconds(kCloseDrainTimeout) + ")"
                         : std::string()));
    }
  }
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  const int64_t lost = dropped();
  if (lost > 0) {
    problems_.report(
        "dropped total",
        std::to_string(lost) + " record(s) were dropped in total");
  }
}

std::string BufferedFileWriter::currentPath() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return path_;
}

void BufferedFileWriter::closeAll() {
  auto& live = liveWriters();
  std::lock_guard<std::mutex> guard(live.mutex);
  for (BufferedFileWriter* writer : live.writers) {
    writer->close();
  }
}

void BufferedFileWriter::flushAll() {
  auto& live = liveWriters();
  std::lock_guard<std::mutex> guard(live.mutex);
  for (BufferedFileWriter* writer : live.writers) {
    writer->flush();
  }
}

void BufferedFileWriter::setWriteErrorForTesting(int error) {
  gWriteErrorForTesting.store(error, std::memory_order_relaxed);
}

} // namespace torch_monitor::sinks::detail
