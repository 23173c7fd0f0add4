// The Prometheus sinks: the exposition text, the request parser, and the
// HTTP server under good and hostile clients.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <torch_monitor/sinks/detail/http_request.h>
#include <torch_monitor/sinks/prometheus_exporter.h>
#include <torch_monitor/sinks/prometheus_text_file.h>

namespace torch_monitor::sinks {
namespace {

using Clock = std::chrono::steady_clock;

Event statEvent(std::unordered_map<std::string, data_value_t> data) {
  Event e;
  e.name = kStatEventName;
  e.timestamp = std::chrono::system_clock::now();
  e.data = std::move(data);
  return e;
}

int connectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  timeval tv{5, 0}; // a test never hangs on a read
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void sendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      return; // the server may close first (431, 400)
    }
    sent += static_cast<size_t>(n);
  }
}

std::string readAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) {
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends `request` on a new connection and returns the whole response.
std::string exchange(int port, const std::string& request) {
  const int fd = connectTo(port);
  sendAll(fd, request);
  std::string out = readAll(fd);
  ::close(fd);
  return out;
}

std::string scrape(int port) {
  return exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
}

TEST(PrometheusFormat, NamesValuesAndEscaping) {
  EXPECT_EQ(prometheus::metricName("loss/train.x-1"), "torch_monitor_loss_train_x_1");
  EXPECT_EQ(prometheus::metricName("a:b_c9"), "torch_monitor_a:b_c9");
  std::string v;
  prometheus::appendLabelValue(v, "a\\b\"c\nd");
  EXPECT_EQ(v, "a\\\\b\\\"c\\nd");
  std::string h;
  prometheus::appendHelpText(h, "a\\b\"c\nd");
  EXPECT_EQ(h, "a\\\\b\"c\\nd");
  std::string bad;
  prometheus::appendLabelValue(bad, std::string("x\xff", 2));
  EXPECT_EQ(bad, "x\xEF\xBF\xBD");
  std::string n;
  prometheus::appendSampleValue(n, std::nan(""));
  n += ' ';
  prometheus::appendSampleValue(n, -INFINITY);
  n += ' ';
  prometheus::appendSampleValue(n, INFINITY);
  n += ' ';
  prometheus::appendSampleValue(n, 0.1);
  EXPECT_EQ(n, "NaN -Inf +Inf 0.1");
}

TEST(PrometheusFormat, LabelsAreChecked) {
  EXPECT_THROW(prometheus::checkedLabels({{"1a", "x"}}), c10::ValueError);
  EXPECT_THROW(prometheus::checkedLabels({{"a-b", "x"}}), c10::ValueError);
  EXPECT_THROW(prometheus::checkedLabels({{"__x", "x"}}), c10::ValueError);
  EXPECT_THROW(prometheus::checkedLabels({{"aggregation", "x"}}), c10::ValueError);
  EXPECT_THROW(
      prometheus::checkedLabels({{"a", std::string("\xff", 1)}}), c10::ValueError);
  const auto labels = prometheus::checkedLabels({{"job", "j"}, {"a_1", "q\""}});
  ASSERT_EQ(labels.size(), 2u);
  EXPECT_EQ(labels[0].first, "a_1"); // sorted
}

TEST(PrometheusFormat, SnapshotRendersLastWindowAndCountTotal) {
  prometheus::Snapshot s;
  s.update(statEvent({{"loss.mean", 0.5}, {"loss.count", int64_t(3)}}));
  s.update(statEvent({{"loss.mean", 0.25}, {"loss.count", int64_t(4)}}));
  s.update(statEvent({{"lr.value", 0.1}}));
  Event other = statEvent({{"x.mean", 9.0}});
  other.name = "my.event";
  s.update(other); // not a Stat: ignored
  const std::string text = s.render({{"job", "a\"b"}});
  EXPECT_EQ(
      text,
      "# HELP torch_monitor_loss torch_monitor Stat 'loss': last closed window\n"
      "# TYPE torch_monitor_loss gauge\n"
      "torch_monitor_loss{job=\"a\\\"b\",aggregation=\"count\"} 4\n"
      "torch_monitor_loss{job=\"a\\\"b\",aggregation=\"mean\"} 0.25\n"
      "# HELP torch_monitor_loss_count_total torch_monitor Stat 'loss': "
      "samples counted, all windows\n"
      "# TYPE torch_monitor_loss_count_total counter\n"
      "torch_monitor_loss_count_total{job=\"a\\\"b\"} 7\n"
      "# HELP torch_monitor_lr torch_monitor Stat 'lr': last closed window\n"
      "# TYPE torch_monitor_lr gauge\n"
      "torch_monitor_lr{job=\"a\\\"b\",aggregation=\"value\"} 0.1\n");
  EXPECT_EQ(s.size(), 2u);
}

TEST(PrometheusFormat, ClashingNamesAreLeftOutAndReported) {
  prometheus::Snapshot s;
  s.update(statEvent({{"a.b.mean", 1.0}}));
  s.update(statEvent({{"a_b.mean", 2.0}}));
  std::vector<std::string> clashes;
  const std::string text = s.render({}, &clashes);
  EXPECT_EQ(clashes, std::vector<std::string>{"a_b"});
  EXPECT_EQ(text.find("} 2"), std::string::npos);
  EXPECT_NE(text.find("torch_monitor_a_b{aggregation=\"mean\"} 1\n"), std::string::npos);
}

TEST(HttpRequest, Parses) {
  using detail::parseHttpRequestHead;
  auto r = parseHttpRequestHead("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", 8192);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.path, "/metrics");
  EXPECT_FALSE(r.head);
  EXPECT_EQ(parseHttpRequestHead("GET /metrics HTTP/1.1\r\nHo", 8192).status, 0);
  EXPECT_EQ(parseHttpRequestHead("HEAD / HTTP/1.0\n\n", 8192).status, 200);
  EXPECT_EQ(parseHttpRequestHead("POST / HTTP/1.1\r\n\r\n", 8192).status, 405);
  EXPECT_EQ(parseHttpRequestHead("GET / HTTP/2.0\r\n\r\n", 8192).status, 505);
  EXPECT_EQ(parseHttpRequestHead("\x16\x03\x01", 8192).status, 400); // TLS
  EXPECT_EQ(parseHttpRequestHead("GET  / HTTP/1.1\r\n\r\n", 8192).status, 400);
  EXPECT_EQ(parseHttpRequestHead("GET / HTTP/1.1\r\nno colon\r\n\r\n", 8192).status, 400);
  EXPECT_EQ(parseHttpRequestHead(std::string(9000, 'A'), 8192).status, 431);
  // The absolute form (a proxy's), whose path is served; the asterisk form
  // is a method's question: 405 for OPTIONS, 505 for HTTP/2's preface.
  r = parseHttpRequestHead("GET HTTP://host:9/metrics?x HTTP/1.1\r\n\r\n", 8192);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.path, "/metrics");
  EXPECT_EQ(parseHttpRequestHead("GET http://host HTTP/1.1\r\n\r\n", 8192).path, "/");
  EXPECT_EQ(parseHttpRequestHead("GET ftp://host/metrics HTTP/1.1\r\n\r\n", 8192).status, 400);
  EXPECT_EQ(parseHttpRequestHead("OPTIONS * HTTP/1.1\r\n\r\n", 8192).status, 405);
  EXPECT_EQ(parseHttpRequestHead("PRI * HTTP/2.0\r\n\r\n", 8192).status, 505);
  EXPECT_EQ(parseHttpRequestHead("GET * HTTP/1.1\r\n\r\n", 8192).status, 400);
}

TEST(HttpRequest, FuzzNeverCrashes) {
  std::mt19937 rng(1234);
  const std::string good = "GET /metrics HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n";
  for (int i = 0; i < 20000; ++i) {
    std::string input;
    if (i % 2 == 0) {
      input = good.substr(0, rng() % (good.size() + 1));
      if (!input.empty()) {
        input[rng() % input.size()] = static_cast<char>(rng());
      }
    } else {
      input.resize(rng() % 64);
      for (char& c : input) {
        c = static_cast<char>(rng());
      }
    }
    const auto r = detail::parseHttpRequestHead(input, 64);
    EXPECT_TRUE(
        r.status == 0 || r.status == 200 || r.status == 400 ||
        r.status == 405 || r.status == 431 || r.status == 505);
  }
}

class ExporterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    exporter = std::make_shared<PrometheusExporter>(
        0, "127.0.0.1", std::map<std::string, std::string>{{"job", "t"}});
    exporter->handle(statEvent({{"loss.mean", 0.5}, {"loss.count", int64_t(2)}}));
  }
  std::shared_ptr<PrometheusExporter> exporter;
};

TEST_F(ExporterTest, ServesMetricsAnd404) {
  ASSERT_GT(exporter->port(), 0);
  EXPECT_TRUE(exporter->serving());
  const std::string r = scrape(exporter->port());
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(
      r.find("torch_monitor_loss{job=\"t\",aggregation=\"mean\"} 0.5\n"),
      std::string::npos);
  EXPECT_EQ(r.substr(r.find("\r\n\r\n") + 4), exporter->render());
  EXPECT_EQ(exchange(exporter->port(), "GET /x HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(exchange(exporter->port(), "\x01\x02garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
}

TEST_F(ExporterTest, HugeRequestIsRefusedAndServerGoesOn) {
  const std::string r = exchange(
      exporter->port(), "GET /" + std::string(100000, 'a') + " HTTP/1.1\r\n\r\n");
  // A 431, or a reset when the server closed with unread bytes pending.
  EXPECT_TRUE(r.empty() || r.rfind("HTTP/1.1 431", 0) == 0) << r.substr(0, 40);
  EXPECT_EQ(scrape(exporter->port()).rfind("HTTP/1.1 200", 0), 0u);
}

TEST_F(ExporterTest, SilentAndSlowClientsDoNotBlockAScrape) {
  std::vector<int> idle;
  for (size_t i = 0; i < PrometheusExporter::kMaxConnections + 8; ++i) {
    idle.push_back(connectTo(exporter->port()));
    sendAll(idle.back(), "GET /met"); // slowloris: never finishes
  }
  const auto start = Clock::now();
  const std::string r = scrape(exporter->port());
  const auto took = Clock::now() - start;
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_LT(took, std::chrono::milliseconds(500));
  for (int fd : idle) {
    ::close(fd);
  }
}

TEST_F(ExporterTest, IdleConnectionIsClosedAfterTheTimeout) {
  const int fd = connectTo(exporter->port());
  const auto start = Clock::now();
  EXPECT_EQ(readAll(fd), ""); // the server closes it
  const auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(PrometheusExporter::kRequestTimeoutMs - 100));
  EXPECT_LT(took, std::chrono::milliseconds(PrometheusExporter::kRequestTimeoutMs + 2000));
  ::close(fd);
}

TEST_F(ExporterTest, ManyScrapesInParallel) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        ok += scrape(exporter->port()).rfind("HTTP/1.1 200", 0) == 0;
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(ok.load(), 200);
}

TEST_F(ExporterTest, FuzzedConnectionsThenAGoodScrape) {
  std::mt19937 rng(42);
  const std::string good = "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n";
  for (int i = 0; i < 2000; ++i) {
    std::string input;
    if (i % 2 == 0) {
      input = good.substr(0, rng() % good.size()); // truncated: times out
    } else {
      input.resize(1 + rng() % 200);
      for (char& c : input) {
        c = static_cast<char>(rng());
      }
    }
    const int fd = connectTo(exporter->port());
    sendAll(fd, input);
    ::close(fd); // the client goes away at once
  }
  EXPECT_EQ(scrape(exporter->port()).rfind("HTTP/1.1 200", 0), 0u);
}

TEST_F(ExporterTest, CloseWhileAClientIsConnected) {
  const int fd = connectTo(exporter->port());
  sendAll(fd, "GET /me");
  const auto start = Clock::now();
  exporter->close();
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_FALSE(exporter->serving());
  EXPECT_EQ(readAll(fd), "");
  ::close(fd);
  // The port is free again.
  const int again = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(exporter->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(::connect(again, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ::close(again);
}

TEST(PrometheusExporter, BadArguments) {
  EXPECT_THROW(PrometheusExporter(70000), c10::ValueError);
  EXPECT_THROW(PrometheusExporter(0, "not a host name!"), c10::ValueError);
  EXPECT_THROW(PrometheusExporter(0, "127.0.0.1", {{"aggregation", "x"}}), c10::ValueError);
  PrometheusExporter first;
  EXPECT_THROW(PrometheusExporter(first.port()), c10::Error); // taken
}

TEST(PrometheusTextFile, RewritesTheFileAtEveryWindow) {
  char dir[] = "/tmp/tm_prom_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/m.prom";
  auto file = std::make_shared<PrometheusTextFile>(path, std::map<std::string, std::string>{{"job", "j"}});
  auto read = [&] {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  EXPECT_EQ(read(), "");
  file->handle(statEvent({{"loss.mean", 0.5}}));
  EXPECT_EQ(
      read(),
      "# HELP torch_monitor_loss torch_monitor Stat 'loss': last closed window\n"
      "# TYPE torch_monitor_loss gauge\n"
      "torch_monitor_loss{job=\"j\",aggregation=\"mean\"} 0.5\n");
  file->close();
  ::unlink(path.c_str());
  ::rmdir(dir);
}

} // namespace
} // namespace torch_monitor::sinks
