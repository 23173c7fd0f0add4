#include <torch_monitor/sinks/prometheus_exporter.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/detail/lifecycle.h>
#include <torch_monitor/detail/text.h>
#include <torch_monitor/sinks/detail/http_request.h>

namespace torch_monitor::sinks {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

struct Connection {
  int fd = -1;
  Clock::time_point deadline;
  std::string received;
  std::string response; // empty while the request is being read
  size_t sent = 0;
  // An error response went out before the whole request came: the rest is
  // read and discarded (closing with unread bytes sends a reset, which can
  // destroy the response before the client read it).
  bool discardRest = false;
  bool discarding = false; // the response is sent; reading what is left
  size_t discarded = 0;
};

void closeFd(int& fd) {
  if (fd >= 0) {
    ::close(fd);
    fd = -1;
  }
}

// Binds and listens, or throws saying what failed.
int listenOn(const std::string& host, int port, int& boundPort) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  TORCH_CHECK_VALUE(
      rc == 0 && found != nullptr,
      "PrometheusExporter: cannot resolve host '",
      host,
      "': ",
      ::gai_strerror(rc),
      "; give an address such as '127.0.0.1' or '0.0.0.0'");
  const int fd = ::socket(
      found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int error = fd < 0 ? errno : 0;
  if (fd >= 0) {
    // A deep accept queue: a burst of connections waits there for the
    // server thread instead of having its SYNs dropped (a 1 s retry).
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 ||
        ::listen(fd, SOMAXCONN) != 0) {
      error = errno;
    }
  }
  ::freeaddrinfo(found);
  if (error != 0) {
    if (fd >= 0) {
      ::close(fd);
    }
    TORCH_CHECK(
        false,
        "PrometheusExporter: cannot listen on ",
        host,
        ":",
        port,
        ": ",
        std::strerror(error),
        "; choose another port, or port=0 for any free one");
  }
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  boundPort = address.ss_family == AF_INET6
      ? ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port)
      : ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  return fd;
}

} // namespace

struct PrometheusExporter::Impl {
  PrometheusExporter& owner;
  const int requestedPort;
  const std::string host;
  const std::map<std::string, std::string> labels;
  const prometheus::Labels checked;
  prometheus::Snapshot snapshot;
  const pid_t creatorPid = ::getpid();
  int listenFd = -1;
  int boundPort = 0;
  int wakeFds[2] = {-1, -1}; // a byte on [1] stops the server thread
  // Owned; in a forked child it names a thread that does not exist there,
  // so it is dropped without being joined (and never freed).
  std::thread* thread = nullptr;
  std::mutex stopMutex; // serialises stop()
  std::atomic<bool> childWarned{false};

  Impl(PrometheusExporter& o, int port, std::string h,
       std::map<std::string, std::string> l, prometheus::Labels c)
      : owner(o),
        requestedPort(port),
        host(std::move(h)),
        labels(std::move(l)),
        checked(std::move(c)) {}

  bool inCreator() const {
    return ::getpid() == creatorPid;
  }

  std::string render() {
    std::vector<std::string> clashes;
    std::string text = snapshot.render(checked, &clashes);
    for (const std::string& stat : clashes) {
      owner.problemLog().report(
          "clash:" + stat,
          "Stat '" + stat +
              "' is left out: another Stat's name gives the same metric name");
    }
    return text;
  }

  void respond(Connection& c, const detail::HttpRequestHead& request) {
    if (request.status != 200) {
      c.response = detail::httpResponse(
          request.status, "text/plain; charset=utf-8", "", false);
    } else if (request.path != "/metrics") {
      c.response = detail::httpResponse(
          404, "text/plain; charset=utf-8", "try /metrics\n", request.head);
    } else {
      c.response =
          detail::httpResponse(200, kContentType, render(), request.head);
    }
    c.deadline =
        Clock::now() + std::chrono::milliseconds(kResponseTimeoutMs);
  }

  // Reads what arrived; returns false when the connection is finished.
  bool readFrom(Connection& c) {
    char buffer[4096];
    while (c.response.empty()) {
      const size_t room = kMaxHeadBytes + 1 - c.received.size();
      const ssize_t n =
          ::recv(c.fd, buffer, std::min(room, sizeof(buffer)), MSG_DONTWAIT);
      if (n == 0) {
        return false; // the client gave up
      }
      if (n < 0) {
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      }
      c.received.append(buffer, static_cast<size_t>(n));
      const auto request =
          detail::parseHttpRequestHead(c.received, kMaxHeadBytes);
      if (request.status != 0) {
        respond(c, request);
        c.discardRest = request.status != 200;
      }
    }
    return true;
  }

  // Reads and drops what the client still sends after an error response;
  // returns false when the connection is finished.
  bool discardFrom(Connection& c) {
    char buffer[4096];
    while (c.discarded < kMaxDiscardBytes) {
      const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n <= 0) {
        return n < 0 &&
            (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
      }
      c.discarded += static_cast<size_t>(n);
    }
    return false; // enough: the client is not sending a request
  }

  // Sends what it can; returns false when the connection is finished.
  bool writeTo(Connection& c) {
    while (c.sent < c.response.size()) {
      const ssize_t n = ::send(
          c.fd,
          c.response.data() + c.sent,
          c.response.size() - c.sent,
          MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      }
      c.sent += static_cast<size_t>(n);
    }
    if (c.discardRest) {
      // All sent: say so (FIN), then read until the client closes.
      ::shutdown(c.fd, SHUT_WR);
      c.discarding = true;
      c.deadline = std::min(
          c.deadline,
          Clock::now() + std::chrono::milliseconds(kRequestTimeoutMs));
      return true;
    }
    return false; // all sent: close
  }

  // Returns when the accept queue is empty, or when no descriptor is left
  // for a connection: then the time until which the listening socket is
  // left alone (it stays readable, and poll() would return at once, in a
  // loop, until a descriptor is freed).
  std::optional<Clock::time_point> acceptAll(
      std::vector<Connection>& connections) {
    while (true) {
      const int fd = ::accept4(
          listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int error = errno;
        if (error == EMFILE || error == ENFILE || error == ENOBUFS ||
            error == ENOMEM) {
          owner.problemLog().report(
              "accept",
              std::string("cannot accept connections: ") +
                  std::strerror(error) +
                  "; scrapes wait in the accept queue until the process "
                  "frees descriptors (retried every " +
                  std::to_string(kAcceptRetryMs) + " ms)");
          return Clock::now() + std::chrono::milliseconds(kAcceptRetryMs);
        }
        return std::nullopt; // EAGAIN, or a failed connection: nothing to do
      }
      if (connections.size() >= kMaxConnections) {
        // Make room: the oldest connection still reading its request (an
        // idle or slow client) or what follows an error response goes, else
        // the oldest of all.
        auto victim = std::find_if(
            connections.begin(), connections.end(), [](const Connection& c) {
              return c.response.empty() || c.discarding;
            });
        if (victim == connections.end()) {
          victim = connections.begin();
        }
        closeFd(victim->fd);
        connections.erase(victim);
      }
      Connection c;
      c.fd = fd;
      c.deadline = Clock::now() + std::chrono::milliseconds(kRequestTimeoutMs);
      connections.push_back(std::move(c));
    }
  }

  void serve() {
    torch_monitor::detail::routeThreadWarningsToBackgroundSink();
    std::vector<Connection> connections;
    std::vector<pollfd> fds;
    std::optional<Clock::time_point> acceptPausedUntil;
    while (true) {
      fds.clear();
      const auto now = Clock::now();
      auto next = now + std::chrono::seconds(1);
      if (acceptPausedUntil && now >= *acceptPausedUntil) {
        acceptPausedUntil.reset();
      }
      fds.push_back({wakeFds[0], POLLIN, 0});
      // Events 0: poll() skips it (its slot is kept, so that the
      // connections' slots start at 2).
      fds.push_back({listenFd, short(acceptPausedUntil ? 0 : POLLIN), 0});
      if (acceptPausedUntil) {
        next = std::min(next, *acceptPausedUntil);
      }
      for (const Connection& c : connections) {
        const short events =
            c.response.empty() || c.discarding ? POLLIN : POLLOUT;
        fds.push_back({c.fd, events, 0});
        next = std::min(next, c.deadline);
      }
      const auto wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(next - now);
      const int timeoutMs =
          static_cast<int>(std::max<int64_t>(0, wait.count()) + 1);
      const int ready = ::poll(fds.data(), fds.size(), timeoutMs);
      if (ready < 0 && errno != EINTR) {
        owner.problemLog().report(
            "poll", std::string("poll failed: ") + std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (ready > 0 && fds[0].revents != 0) {
        break;
      }
      // Connections first (their slots in fds match), then new ones.
      const auto after = Clock::now();
      std::vector<Connection> kept;
      kept.reserve(connections.size());
      for (size_t i = 0; i < connections.size(); ++i) {
        Connection& c = connections[i];
        const short events = ready > 0 ? fds[i + 2].revents : 0;
        bool open = true;
        if (c.discarding) {
          open = events == 0 || discardFrom(c);
        } else {
          if (events != 0 && c.response.empty()) {
            open = readFrom(c);
          }
          if (open && !c.response.empty() &&
              (events != 0 || c.sent == 0)) {
            open = writeTo(c);
          }
        }
        if (open && after >= c.deadline) {
          open = false; // too slow: slowloris, or a reader that stalls
        }
        if (open) {
          kept.push_back(std::move(c));
        } else {
          closeFd(c.fd);
        }
      }
      connections.swap(kept);
      if (ready > 0 && fds[1].revents != 0) {
        acceptPausedUntil = acceptAll(connections);
      }
    }
    for (Connection& c : connections) {
      closeFd(c.fd);
    }
  }

  void stop() {
    std::lock_guard<std::mutex> guard(stopMutex);
    if (thread == nullptr) {
      return;
    }
    if (inCreator()) {
      const char byte = 1;
      while (::write(wakeFds[1], &byte, 1) < 0 && errno == EINTR) {
      }
      thread->join();
      delete thread;
    }
    thread = nullptr; // a child's copy names no thread: dropped unjoined
    closeFd(listenFd);
    closeFd(wakeFds[0]);
    closeFd(wakeFds[1]);
  }
};

namespace {

// The exporters alive, so that process exit stops their threads before
// static destruction (a serving thread must not outlive the library).
struct LiveExporters {
  std::mutex mutex;
  std::vector<PrometheusExporter*> all;
  torch_monitor::detail::ForkSafeLocks forkLocks{
      torch_monitor::detail::ForkLockMode::kInner, {&mutex}};

  static LiveExporters& get() {
    // Never destroyed: exporters may be destroyed during static destruction.
    static LiveExporters* live = [] {
      auto* l = new LiveExporters();
      torch_monitor::detail::onExit(
          torch_monitor::detail::ExitStage::kPrometheusExporters, [] {
            auto& self = LiveExporters::get();
            std::vector<PrometheusExporter*> all;
            {
              std::lock_guard<std::mutex> guard(self.mutex);
              all = self.all;
            }
            for (PrometheusExporter* e : all) {
              e->close();
            }
          });
      return l;
    }();
    return *live;
  }
};

} // namespace

struct PrometheusExporter::Bound {
  int fd;
  int port; // bound
  int requestedPort;
  prometheus::Labels checked; // the labels, checked before the socket
};

PrometheusExporter::Bound PrometheusExporter::bind(
    int port,
    const std::string& host,
    const std::map<std::string, std::string>& labels) {
  TORCH_CHECK_VALUE(
      port >= 0 && port <= 65535,
      "PrometheusExporter: port must be in 0..65535 (0: any free port), got ",
      port);
  torch_monitor::detail::checkText(host, "PrometheusExporter: host");
  Bound bound{-1, 0, port, prometheus::checkedLabels(labels)};
  bound.fd = listenOn(host, port, bound.port);
  return bound;
}

// The arguments are copied, not moved: bind() reads them, and the order in
// which a call's arguments are made is unspecified.
PrometheusExporter::PrometheusExporter(
    int port,
    std::string host,
    std::map<std::string, std::string> labels)
    : PrometheusExporter(bind(port, host, labels), host, labels) {}

PrometheusExporter::PrometheusExporter(
    Bound bound,
    std::string host,
    std::map<std::string, std::string> labels)
    : Sink(
          "PrometheusExporter(" + host + ":" + std::to_string(bound.port) +
          ")") {
  try {
    impl_ = std::make_unique<Impl>(
        *this,
        bound.requestedPort,
        std::move(host),
        std::move(labels),
        std::move(bound.checked));
  } catch (...) {
    closeFd(bound.fd);
    throw;
  }
  impl_->listenFd = bound.fd;
  impl_->boundPort = bound.port;
  if (::pipe2(impl_->wakeFds, O_NONBLOCK | O_CLOEXEC) != 0) {
    const int error = errno;
    closeFd(impl_->listenFd);
    TORCH_CHECK(false, "PrometheusExporter: pipe2: ", std::strerror(error));
  }
  impl_->thread = new std::thread([impl = impl_.get()] { impl->serve(); });
  auto& live = LiveExporters::get();
  std::lock_guard<std::mutex> guard(live.mutex);
  live.all.push_back(this);
}

PrometheusExporter::~PrometheusExporter() {
  close();
  auto& live = LiveExporters::get();
  std::lock_guard<std::mutex> guard(live.mutex);
  live.all.erase(
      std::remove(live.all.begin(), live.all.end(), this), live.all.end());
}

void PrometheusExporter::handle(const Event& event) {
  if (closed() || !prometheus::isWindowEvent(event)) {
    return;
  }
  if (!impl_->inCreator() && !impl_->childWarned.exchange(true)) {
    problemLog().report(
        "fork",
        "not serving in this forked child (pid " + std::to_string(::getpid()) +
            "): the server thread stays with the parent; create a new "
            "PrometheusExporter (on another port) to serve from the child",
        ProblemLog::WarnVia::kBackgroundSink);
  }
  impl_->snapshot.update(event);
}

int PrometheusExporter::port() const noexcept {
  return impl_->boundPort;
}

int PrometheusExporter::requestedPort() const noexcept {
  return impl_->requestedPort;
}

const std::string& PrometheusExporter::host() const noexcept {
  return impl_->host;
}

const std::map<std::string, std::string>& PrometheusExporter::labels()
    const noexcept {
  return impl_->labels;
}

std::string PrometheusExporter::render() const {
  return impl_->render();
}

bool PrometheusExporter::serving() const {
  std::lock_guard<std::mutex> guard(impl_->stopMutex);
  return impl_->thread != nullptr && impl_->inCreator();
}

void PrometheusExporter::closeOutput() {
  impl_->stop();
}

} // namespace torch_monitor::sinks
