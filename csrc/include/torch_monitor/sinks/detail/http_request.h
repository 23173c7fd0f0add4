#pragma once

// The little HTTP the Prometheus exporter understands: the head of one
// request, read by a parser that never trusts its input. Not part of the
// stable API (public only so that the tests can fuzz it).

#include <cstddef>
#include <string>
#include <string_view>

#include <torch_monitor/export.h>

namespace torch_monitor::sinks::detail {

// What the bytes received so far ask for. Thread safety: a plain value.
struct HttpRequestHead {
  // 0: the head is not complete yet (read more). Otherwise the status to
  // answer with: 200 (a GET or HEAD of `path`), 400 (malformed), 405 (a
  // method other than GET and HEAD), 431 (head longer than the bound),
  // 505 (not HTTP/1.x).
  int status = 0;
  bool head = false; // a HEAD request: answer without the body
  std::string path; // the target without its query string (status 200)
};

// Parses `received`, the first bytes of a connection. A head is the
// request line and header lines, each ending in CRLF (or LF), then an empty
// line; it must fit in `maxBytes`. Bytes that no request line can start
// with (control characters, non-ASCII) are a 400 at once, without waiting
// for the rest. Thread safety: a pure function.
TORCH_MONITOR_API HttpRequestHead
parseHttpRequestHead(std::string_view received, size_t maxBytes);

// "HTTP/1.1 <status> <reason>\r\n" + Content-Type, Content-Length and
// Connection: close headers + body (left out for a HEAD request, with its
// length still announced).
TORCH_MONITOR_API std::string httpResponse(
    int status,
    std::string_view contentType,
    std::string_view body,
    bool head);

} // namespace torch_monitor::sinks::detail
