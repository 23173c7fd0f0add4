#include <torch_monitor/sinks/detail/http_request.h>

namespace torch_monitor::sinks::detail {
namespace {

// RFC 9110 token characters (methods, header names).
bool isTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
      (c >= '0' && c <= '9')) {
    return true;
  }
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool isVisible(char c) {
  return c > 0x20 && c < 0x7f;
}

// ASCII letters compared without case (a URI scheme's rule).
bool caseInsensitiveEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if ((a[i] | 0x20) != (b[i] | 0x20)) {
      return false;
    }
  }
  return true;
}

HttpRequestHead answer(int status) {
  HttpRequestHead out;
  out.status = status;
  return out;
}

// Splits off one line (without CR LF) from `rest`.
std::string_view nextLine(std::string_view& rest) {
  const size_t lf = rest.find('\n');
  std::string_view line = rest.substr(0, lf);
  rest.remove_prefix(lf == std::string_view::npos ? rest.size() : lf + 1);
  if (!line.empty() && line.back() == '\r') {
    line.remove_suffix(1);
  }
  return line;
}

bool validHeaderLine(std::string_view line) {
  const size_t colon = line.find(':');
  if (colon == 0 || colon == std::string_view::npos) {
    return false;
  }
  for (size_t i = 0; i < colon; ++i) {
    if (!isTokenChar(line[i])) {
      return false;
    }
  }
  for (size_t i = colon + 1; i < line.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      return false; // obs-text (>= 0x80) is allowed in values
    }
  }
  return true;
}

const char* reasonOf(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

} // namespace

HttpRequestHead parseHttpRequestHead(
    std::string_view received,
    size_t maxBytes) {
  // Garbage is refused as soon as it arrives: the request line is visible
  // ASCII and spaces up to its end.
  const size_t firstLf = received.find('\n');
  const std::string_view firstLine = received.substr(0, firstLf);
  for (size_t i = 0; i < firstLine.size(); ++i) {
    const char c = firstLine[i];
    const bool lastCr = c == '\r' && i + 1 == firstLine.size() &&
        firstLf != std::string_view::npos;
    if (!isVisible(c) && c != ' ' && !lastCr) {
      return answer(400);
    }
  }
  size_t end = received.find("\r\n\r\n");
  size_t endLength = 4;
  const size_t lfEnd = received.find("\n\n");
  if (lfEnd != std::string_view::npos &&
      (end == std::string_view::npos || lfEnd < end)) {
    end = lfEnd;
    endLength = 2;
  }
  if (end == std::string_view::npos) {
    return answer(received.size() >= maxBytes ? 431 : 0);
  }
  if (end + endLength > maxBytes) {
    return answer(431);
  }
  std::string_view rest = received.substr(0, end + endLength);
  const std::string_view line = nextLine(rest);
  // METHOD SP TARGET SP VERSION, single spaces.
  const size_t sp1 = line.find(' ');
  const size_t sp2 =
      sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == 0 || sp2 == std::string_view::npos || sp2 == sp1 + 1 ||
      line.find(' ', sp2 + 1) != std::string_view::npos) {
    return answer(400);
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  for (char c : method) {
    if (!isTokenChar(c)) {
      return answer(400);
    }
  }
  // The path of an origin-form target ("/metrics"), or of an
  // absolute-form one ("http://host:9100/metrics", which RFC 9112 has
  // servers accept, as proxies send it). The asterisk form ("*") goes on to
  // the method's check: OPTIONS and PRI (HTTP/2's preface) take it.
  std::string_view path = target;
  const size_t scheme = target.find("://");
  if (scheme != std::string_view::npos &&
      (caseInsensitiveEqual(target.substr(0, scheme), "http") ||
       caseInsensitiveEqual(target.substr(0, scheme), "https"))) {
    const size_t slash = target.find('/', scheme + 3);
    path = slash == std::string_view::npos ? "/" : target.substr(slash);
  } else if (target.front() != '/' && !(target == "*" && method != "GET" &&
                                          method != "HEAD")) {
    return answer(400);
  }
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" ||
      version[6] != '.' || version[5] < '0' || version[5] > '9' ||
      version[7] < '0' || version[7] > '9') {
    return answer(400);
  }
  if (version[5] != '1') {
    return answer(505);
  }
  while (!rest.empty()) {
    const std::string_view header = nextLine(rest);
    if (!header.empty() && !validHeaderLine(header)) {
      return answer(400);
    }
  }
  if (method != "GET" && method != "HEAD") {
    return answer(405);
  }
  HttpRequestHead out;
  out.status = 200;
  out.head = method == "HEAD";
  out.path = std::string(path.substr(0, path.find('?')));
  return out;
}

std::string httpResponse(
    int status,
    std::string_view contentType,
    std::string_view body,
    bool head) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " +
      reasonOf(status) + "\r\nContent-Type: ";
  out += contentType;
  out += "\r\nContent-Length: " + std::to_string(body.size());
  out += "\r\nConnection: close\r\n\r\n";
  if (!head) {
    out += body;
  }
  return out;
}

} // namespace torch_monitor::sinks::detail
