#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>
#include <torch_monitor/sinks/format/prometheus.h>
#include <torch_monitor/sinks/sink.h>

namespace torch_monitor::sinks {

// Serves the last closed window of every Stat at GET /metrics in the
// Prometheus text format 0.0.4 (see prometheus::Snapshot::render), from a
// small HTTP server on its own thread. A scrape renders the snapshot kept
// by handle(); it never touches a Stat, so scraping cannot slow Stat::add.
//
// Robustness (docs/prometheus.md): one thread multiplexes the
// listening socket and at most kMaxConnections connections with poll(); a
// connection must deliver its request head (at most kMaxHeadBytes, else 431)
// within kRequestTimeout and take its response within kResponseTimeout, or
// it is closed; when all slots are taken, the oldest connection still
// reading its request is dropped for the new one, so idle or slow clients
// cannot keep a scrape out. Malformed requests get a 400, other paths a
// 404, and every connection is closed after one response; after an error
// response the rest of the request is read and discarded (at most
// kMaxDiscardBytes, within kRequestTimeout) before the close, so that the
// client reads the response instead of a connection reset. When the
// process is out of file descriptors, new connections wait in the accept
// queue (accepting is retried every kAcceptRetryMs, warned once) instead
// of the thread spinning on a listening socket it cannot empty.
// In a forked child the server does not run (threads do not survive
// fork()): the child's copy warns once and the parent keeps serving. The
// server stops at close(), destruction or process exit.
// Thread safety: no concurrent call to any API of this type causes a data
// race; handle() may run on many threads at once.
class TORCH_MONITOR_API PrometheusExporter final : public Sink {
 public:
  static constexpr size_t kMaxConnections = 16;
  static constexpr size_t kMaxHeadBytes = 8192;
  static constexpr int kRequestTimeoutMs = 2000;
  static constexpr int kResponseTimeoutMs = 10000;
  static constexpr size_t kMaxDiscardBytes = 4 << 20;
  static constexpr int kAcceptRetryMs = 100;

  // Listens on host:port (port 0: any free port, see port()); `labels` are
  // added to every sample (checked by prometheus::checkedLabels). Throws
  // c10::ValueError for bad labels or a host that is not an address, and
  // c10::Error when the socket cannot be bound.
  explicit PrometheusExporter(
      int port = 0,
      std::string host = "127.0.0.1",
      std::map<std::string, std::string> labels = {});
  ~PrometheusExporter() override;

  void handle(const Event& event) override;

  // The port bound (the one asked for, or the one picked for port 0).
  int port() const noexcept;
  // The port asked for.
  int requestedPort() const noexcept;
  const std::string& host() const noexcept;
  const std::map<std::string, std::string>& labels() const noexcept;
  // What a scrape of /metrics returns now.
  std::string render() const;
  // Whether the server runs in this process (false after close() and in a
  // forked child).
  bool serving() const;

 protected:
  void closeOutput() override;

 private:
  // The listening socket, bound (after the arguments are checked) before
  // the Sink is made, so that the sink's name in its warnings and problems
  // carries the port bound rather than 0.
  struct Bound;
  static Bound bind(
      int port,
      const std::string& host,
      const std::map<std::string, std::string>& labels);
  PrometheusExporter(
      Bound bound,
      std::string host,
      std::map<std::string, std::string> labels);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace torch_monitor::sinks
