#include <torch_monitor/sinks/prometheus_text_file.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch_monitor/sinks/detail/open_file.h>

namespace torch_monitor::sinks {
namespace {

// `path`, then the target of each symbolic link on the way to the file it
// names (at most 40, as the kernel follows), whether that file exists or not.
std::vector<std::filesystem::path> linkHops(const std::string& path) {
  std::vector<std::filesystem::path> hops{path};
  for (int links = 0; links < 40; ++links) {
    const std::filesystem::path& hop = hops.back();
    std::error_code error;
    if (!std::filesystem::is_symlink(hop, error)) {
      break;
    }
    const std::filesystem::path next = std::filesystem::read_symlink(hop, error);
    if (error) {
      break;
    }
    hops.push_back(next.is_absolute() ? next : hop.parent_path() / next);
  }
  return hops;
}

// Whether `path` reaches its file through a process' open descriptor
// (/dev/stdout -> /proc/self/fd/1, /dev/fd/2): a redirected stdout names
// the log file it writes to, which a rename over it would replace, so the
// program's own output would go to a deleted file.
bool throughOpenDescriptor(const std::string& path) {
  for (const std::filesystem::path& hop : linkHops(path)) {
    std::error_code error;
    const std::filesystem::path dir = std::filesystem::canonical(
        hop.parent_path().empty() ? "." : hop.parent_path(), error);
    const std::string d = dir.string();
    if (!error && d.rfind("/proc/", 0) == 0 && d.size() >= 3 &&
        d.compare(d.size() - 3, 3, "/fd") == 0) {
      return true;
    }
  }
  return false;
}

} // namespace

PrometheusTextFile::PrometheusTextFile(
    std::string path,
    std::map<std::string, std::string> labels)
    : Sink("PrometheusTextFile('" + path + "')"),
      path_(std::move(path)),
      labels_(std::move(labels)),
      checked_(prometheus::checkedLabels(labels_)) {
  checkPathText(path_, "PrometheusTextFile: path");
  TORCH_CHECK_VALUE(
      !path_.empty() && path_.back() != '/',
      "PrometheusTextFile: path must name a file, got '",
      path_,
      "'");
  // As JsonLinesWriter: a directory is a mistake to report now, not a
  // rename failure at every window.
  struct stat st {};
  const bool exists = ::stat(path_.c_str(), &st) == 0;
  TORCH_CHECK_VALUE(
      !exists || !S_ISDIR(st.st_mode),
      "PrometheusTextFile: '",
      path_,
      "' is a directory; pass a file path such as '",
      path_,
      "/metrics.prom'");
  // Each window renames a new file over the path: a device, pipe or socket
  // there (as /dev/stdout, a link to one) would be replaced by a file.
  TORCH_CHECK_VALUE(
      !exists || S_ISREG(st.st_mode),
      "PrometheusTextFile: '",
      path_,
      "' is not a regular file (a device, pipe or socket): the sink replaces "
      "its file at every window, renaming a new one over it, which would "
      "replace that; pass the path of a file, such as 'metrics.prom' (use "
      "PrometheusExporter to serve the metrics)");
  TORCH_CHECK_VALUE(
      !exists || !throughOpenDescriptor(path_),
      "PrometheusTextFile: '",
      path_,
      "' names a file through an open file descriptor (as /dev/stdout "
      "does): the sink replaces its file at every window, which would "
      "replace the file that descriptor writes to; pass the path of a file "
      "of its own, such as 'metrics.prom' (use PrometheusExporter to serve "
      "the metrics)");
  // Through a symbolic link the file it names is replaced, not the link,
  // also when that file does not exist yet (a dangling link).
  target_ = linkHops(path_).back().string();
  // An empty exposition at once: the collector sees the file, and a bad
  // path is reported now rather than at the first window.
  std::lock_guard<std::mutex> guard(writeMutex_);
  writeLocked(ProblemLog::WarnVia::kCaller);
}

PrometheusTextFile::~PrometheusTextFile() {
  close();
}

void PrometheusTextFile::handle(const Event& event) {
  if (closed() || !prometheus::isWindowEvent(event)) {
    return;
  }
  snapshot_.update(event);
  std::lock_guard<std::mutex> guard(writeMutex_);
  if (!writeLocked(ProblemLog::WarnVia::kBackgroundSink)) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
  }
}

bool PrometheusTextFile::writeLocked(ProblemLog::WarnVia via) {
  std::vector<std::string> clashes;
  const std::string text = snapshot_.render(checked_, &clashes);
  for (const std::string& stat : clashes) {
    problemLog().report(
        "clash:" + stat,
        "Stat '" + stat +
            "' is left out: another Stat's name gives the same metric name",
        via);
  }
  // Same directory, so rename(2) is atomic; the pid keeps a forked child's
  // temporary file apart from its parent's.
  const std::string temp = target_ + ".tmp." + std::to_string(::getpid());
  const int fd =
      detail::openFile(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  auto fail = [&](const char* what) {
    const int error = errno;
    problemLog().report(
        std::string("write:") + what,
        std::string("cannot ") + what + " '" + temp + "': " +
            std::strerror(error) + " (retried at the next window)",
        via);
  };
  if (fd < 0) {
    fail("create");
    return false;
  }
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      fail("write");
      ::close(fd);
      ::unlink(temp.c_str());
      return false;
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    fail("write");
    ::unlink(temp.c_str());
    return false;
  }
  if (::rename(temp.c_str(), target_.c_str()) != 0) {
    fail("rename");
    ::unlink(temp.c_str());
    return false;
  }
  return true;
}

} // namespace torch_monitor::sinks
