#include <torch_monitor/sinks/json_lines_writer.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <torch_monitor/process_rank.h>
#include <torch_monitor/sinks/detail/buffered_file_writer.h>
#include <torch_monitor/sinks/detail/open_file.h>
#include <torch_monitor/sinks/format/text.h>

namespace torch_monitor::sinks {
namespace {

// Newlines inside strings are escaped, so a raw '\n' only ends a record.
size_t lineEnd(std::string_view data, size_t pos) {
  const size_t newline = data.find('\n', pos);
  return newline == std::string_view::npos ? data.size() : newline + 1;
}

// "\n" when `path` is a regular file whose last byte is not a newline (a
// line another program did not finish): appended records then start on a
// line of their own. Read through a descriptor of its own: the writer's is
// write-only.
std::string endOpenLine(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
    return std::string();
  }
  const int fd = detail::openFile(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    return std::string();
  }
  char last = '\n';
  const bool read = ::pread(fd, &last, 1, st.st_size - 1) == 1;
  ::close(fd);
  return read && last != '\n' ? std::string("\n") : std::string();
}

} // namespace

struct JsonLinesWriter::Impl {
  Impl(std::string file, JsonLinesWriterOptions opts, ProblemLog& problems)
      : path(std::move(file)),
        options(std::move(opts)),
        filePath(rankPath(path, options.ranks, /*isDirectory=*/false)),
        filter(options.eventNames),
        writer(
            detail::FileLayout{
                [this] { return *filePath; },
                &endOpenLine, // after the open: a truncated file is empty
                &lineEnd,
                /*exclusive=*/false,
                /*truncateFirst=*/!options.append},
            detail::BufferOptions{
                options.flushInterval, options.maxBufferBytes},
            problems) {}

  const std::string path;
  const JsonLinesWriterOptions options;
  // Nothing on a rank that writes nothing (RankFiles::Zero): then no file
  // is opened and every event is ignored.
  const std::optional<std::string> filePath;
  const EventNameFilter filter;
  detail::BufferedFileWriter writer;
};

JsonLinesWriter::JsonLinesWriter(std::string path, JsonLinesWriterOptions options)
    : Sink("JsonLinesWriter('" + path + "')") {
  TORCH_CHECK_VALUE(
      !path.empty(),
      "JsonLinesWriter: path is empty; pass the file to write, e.g. "
      "\"runs/exp1/events.jsonl\"");
  TORCH_CHECK_VALUE(
      path.back() != '/',
      "JsonLinesWriter: '",
      path,
      "' names a directory; pass a file path such as '",
      path,
      "events.jsonl'");
  checkPathText(path, "JsonLinesWriter: path");
  // Checked now, as the other argument errors are; a directory made later
  // is an open failure, reported like any other.
  struct stat st {};
  TORCH_CHECK_VALUE(
      ::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode),
      "JsonLinesWriter: '",
      path,
      "' is a directory; pass a file path such as '",
      path,
      "/events.jsonl'");
  impl_ =
      std::make_unique<Impl>(std::move(path), std::move(options), problemLog());
  if (impl_->filePath) {
    impl_->writer.start();
  }
}

JsonLinesWriter::~JsonLinesWriter() {
  close();
}

void JsonLinesWriter::handle(const Event& event) {
  if (!impl_->filePath || !impl_->filter.accepts(event.name)) {
    return;
  }
  // Encoded outside the lock into a per-thread scratch (sorting keys and
  // formatting numbers is the slow part); only the copy is serialised.
  thread_local std::string line;
  line.clear();
  text::appendJsonLine(line, event, distributedRank());
  impl_->writer.append([&](std::string& buffer) {
    buffer.append(line);
    return size_t(1);
  });
}

void JsonLinesWriter::flush() {
  impl_->writer.flush();
}

int64_t JsonLinesWriter::dropped() const {
  return impl_->writer.dropped();
}

const std::string& JsonLinesWriter::path() const noexcept {
  return impl_->path;
}

const JsonLinesWriterOptions& JsonLinesWriter::options() const noexcept {
  return impl_->options;
}

const std::string& JsonLinesWriter::filePath() const noexcept {
  static const std::string none;
  return impl_->filePath ? *impl_->filePath : none;
}

void JsonLinesWriter::closeOutput() {
  impl_->writer.close();
}

} // namespace torch_monitor::sinks
