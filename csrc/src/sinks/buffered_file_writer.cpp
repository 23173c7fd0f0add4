#include <torch_monitor/sinks/detail/buffered_file_writer.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>

namespace torch_monitor::sinks::detail {
namespace {

std::atomic<int> gWriteErrorForTesting{0};

// Every live writer, so that process exit can flush and join them all: a
// registered sink is owned by the (never destroyed) handler registry, so its
// destructor would never run. Leaked so that it outlives every static.
struct LiveWriters {
  std::mutex mutex;
  std::vector<BufferedFileWriter*> writers;
};
LiveWriters& liveWriters() {
  static auto* instance = new LiveWriters();
  return *instance;
}

// Constructed when the library is loaded, so its destructor runs at exit (or
// dlclose) before those of the libraries we depend on (c10's warning
// machinery stays usable).
struct CloseAllAtExit {
  ~CloseAllAtExit() {
    BufferedFileWriter::closeAll();
  }
} gCloseAllAtExit;

void onForkChild() {
  BufferedFileWriter::forkGeneration().fetch_add(1, std::memory_order_relaxed);
}

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

std::atomic<uint64_t>& BufferedFileWriter::forkGeneration() noexcept {
  static std::atomic<uint64_t> generation{0};
  return generation;
}

BufferedFileWriter::BufferedFileWriter(
    FileLayout layout,
    BufferOptions options,
    ProblemLog& problems)
    : layout_(std::move(layout)),
      options_(options),
      problems_(problems),
      generation_(forkGeneration().load(std::memory_order_relaxed)),
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
  static std::once_flag atforkOnce;
  std::call_once(atforkOnce, [] {
    pthread_atfork(nullptr, nullptr, &onForkChild);
  });
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

void BufferedFileWriter::reportDropped() {
  problems_.report(
      "dropped",
      "the in-memory buffer is full (" +
          std::to_string(maxBufferBytes_) +
          " bytes): the output is slower than the events, or failing; newer "
          "events are dropped until it catches up (dropped() counts them; "
          "raise max_buffer_bytes or log less often)");
}

void BufferedFileWriter::flush() {
  if (forkGeneration().load(std::memory_order_relaxed) != generation_) {
    return;
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

void BufferedFileWriter::flushLocked(bool openEvenIfIdle) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    flushRequested_ = false;
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
  while (written_ < pending_.size()) {
    ssize_t n;
    const int injected = gWriteErrorForTesting.load(std::memory_order_relaxed);
    if (injected != 0) {
      n = -1;
      errno = injected;
    } else {
      n = ::write(fd_, pending_.data() + written_, pending_.size() - written_);
    }
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) {
        continue;
      }
      problems_.report(
          "write " + std::to_string(error),
          "cannot write to '" + currentPath() + "': " + errorText(error) +
              " (free disk space or fix the device)" + bufferedNote());
      std::lock_guard<std::mutex> guard(mutex_);
      pendingBytes_ = pending_.size() - written_;
      return;
    }
    written_ += static_cast<size_t>(n);
  }
  pending_.clear();
  written_ = 0;
  std::lock_guard<std::mutex> guard(mutex_);
  pendingBytes_ = 0;
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
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
    flags |= layout_.exclusive ? O_EXCL : O_APPEND;
    if (layout_.truncateFirst && !openedOnce_) {
      flags |= O_TRUNC;
    }
    const int fd = ::open(path.c_str(), flags, 0666);
    if (fd < 0) {
      const int error = errno;
      if (error == EEXIST && layout_.exclusive) {
        continue;
      }
      if (error == EINTR) {
        continue;
      }
      problems_.report(
          "open " + path + " " + std::to_string(error),
          "cannot open '" + path + "' for writing: " + errorText(error) +
              " (fix the path or its permissions)" + bufferedNote());
      return false;
    }
    fd_ = fd;
    openedOnce_ = true;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      path_ = path;
    }
    if (written_ > 0) {
      // The previous file got part of a record; the new one starts at the
      // next record boundary.
      const size_t end =
          std::min(layout_.recordEnd(pending_, written_), pending_.size());
      pending_.erase(0, end);
      written_ = 0;
      dropped_.fetch_add(1, std::memory_order_relaxed);
    }
    const std::string header = layout_.header();
    pending_.insert(0, header);
    return true;
  }
  problems_.report(
      "names exhausted",
      "found no free file name in '" + parentOf(layout_.nextPath()) + "'" +
          bufferedNote());
  return false;
}

void BufferedFileWriter::close() {
  if (forkGeneration().load(std::memory_order_relaxed) != generation_) {
    // A forked child: the flusher thread does not exist here (joining or
    // destroying its handle is undefined), the locks may have been held by
    // parent threads at the fork, and the file descriptor is the parent's.
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
    closed_ = true; // later appends are ignored
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_ != nullptr && thread_->joinable()) {
    thread_->join();
  }
  std::lock_guard<std::mutex> io(ioMutex_);
  flushLocked(/*openEvenIfIdle=*/false);
  if (written_ < pending_.size()) {
    problems_.report(
        "lost at close",
        std::to_string(pending_.size() - written_) +
            " bytes of events could not be written before close and are "
            "lost");
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

void BufferedFileWriter::setWriteErrorForTesting(int error) {
  gWriteErrorForTesting.store(error, std::memory_order_relaxed);
}

} // namespace torch_monitor::sinks::detail
