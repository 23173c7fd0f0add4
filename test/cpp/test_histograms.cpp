// TensorBoard histograms from C++: the bucketing (computeHistogram, compared
// with numbers SummaryWriter.add_histogram gives for the same tensors), the
// HistogramProto bytes, and TensorBoardWriter::addHistogram with its steps
// and a DifferenceMonitor feeding it. test/python/test_histograms.py checks
// the same code against SummaryWriter through TensorBoard's reader.

#include <cmath>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <torch_monitor/monitors/difference_monitor.h>
#include <torch_monitor/reducers/factory.h>
#include <torch_monitor/sinks/format/histogram.h>
#include <torch_monitor/sinks/format/tensorboard.h>
#include <torch_monitor/sinks/tensorboard_writer.h>
#include <torch_monitor/step.h>

#include "test_support.h"

namespace fs = std::filesystem;
using torch_monitor::sinks::computeHistogram;
using torch_monitor::sinks::Histogram;
using torch_monitor::sinks::TensorBoardWriter;
using torch_monitor::test::TempDir;

namespace {

// SummaryWriter's default edges, as Python prints them.
constexpr double kOuterEdge = 9.920775621859783e+19;
constexpr double kBelowOne = 0.917246389039776;
constexpr double kAboveOne = 1.0089710279437536;

TEST(Histogram, DefaultEdges) {
  const auto& edges = torch_monitor::sinks::defaultHistogramEdges();
  ASSERT_EQ(edges.size(), 1549u); // len(SummaryWriter().default_bins)
  EXPECT_EQ(edges.front(), -kOuterEdge);
  EXPECT_EQ(edges.back(), kOuterEdge);
  EXPECT_EQ(edges[774], 0.0);
  EXPECT_EQ(edges[775], 1e-12);
}

TEST(Histogram, BucketsLikeSummaryWriter) {
  // SummaryWriter: one value 1.0 -> limits [0.917.., 1.0089..], counts [0, 1]
  Histogram h = computeHistogram(at::ones({1}));
  EXPECT_EQ(h.bucketLimits, (std::vector<double>{kBelowOne, kAboveOne}));
  EXPECT_EQ(h.bucketCounts, (std::vector<double>{0, 1}));
  EXPECT_EQ(h.min, 1.0);
  EXPECT_EQ(h.max, 1.0);
  EXPECT_EQ(h.num, 1.0);
  EXPECT_EQ(h.sum, 1.0);
  EXPECT_EQ(h.sumSquares, 1.0);

  // zeros(3): limits [0, 1e-12], counts [0, 3]
  h = computeHistogram(at::zeros({3}, at::kInt));
  EXPECT_EQ(h.bucketLimits, (std::vector<double>{0.0, 1e-12}));
  EXPECT_EQ(h.bucketCounts, (std::vector<double>{0, 3}));

  // -1.0: limits [-1.0089.., -0.917..], counts [0, 1]
  h = computeHistogram(-at::ones({2, 1}).t());
  EXPECT_EQ(h.bucketLimits, (std::vector<double>{-kAboveOne, -kBelowOne}));
  EXPECT_EQ(h.bucketCounts, (std::vector<double>{0, 2}));

  // The last edge belongs to the last bucket; NaN and beyond-edge values
  // count in num, min, max and sum only.
  h = computeHistogram(at::tensor(
      {kOuterEdge, 1e30, std::nan("")}, at::TensorOptions(at::kDouble)));
  EXPECT_EQ(h.bucketLimits, (std::vector<double>{9.018886928963438e+19, kOuterEdge}));
  EXPECT_EQ(h.bucketCounts, (std::vector<double>{0, 1}));
  EXPECT_EQ(h.num, 3.0);
  EXPECT_TRUE(std::isnan(h.min) && std::isnan(h.sum));
}

// The CPU loop and the tensor-op counter (used on GPUs) agree, edges,
// out-of-range values and NaN included.
TEST(Histogram, CpuLoopAndTensorOpsCountAlike) {
  const auto& edges = torch_monitor::sinks::defaultHistogramEdges();
  std::vector<double> special(edges.begin(), edges.end());
  for (double e : edges) {
    special.push_back(std::nextafter(e, 0.0));
    special.push_back(std::nextafter(e, 1e300));
  }
  special.insert(
      special.end(),
      {1e30, -1e30, std::nan(""), std::numeric_limits<double>::infinity(),
       -std::numeric_limits<double>::infinity(), 0.0, -0.0});
  const at::Tensor cases[] = {
      at::tensor(special, at::TensorOptions(at::kDouble)),
      at::randn({100000}, at::kDouble) * 1e3,
      at::exp(at::randn({100000}, at::kDouble) * 20) - 1,
  };
  for (const at::Tensor& values : cases) {
    const at::Tensor a = torch_monitor::sinks::detail::countBucketsOnCpu(values);
    const at::Tensor b =
        torch_monitor::sinks::detail::countBucketsWithTensorOps(values);
    EXPECT_TRUE(at::equal(a, b));
    EXPECT_GT(a.sum().item<double>(), 0);
  }
}

TEST(Histogram, BadValuesThrowClearly) {
  EXPECT_THROW(computeHistogram(at::zeros({0})), c10::ValueError);
  EXPECT_THROW(computeHistogram(at::ones({2}, at::kComplexFloat)), c10::TypeError);
  EXPECT_THROW(
      computeHistogram(at::full({2}, std::numeric_limits<double>::infinity())),
      c10::ValueError);
  EXPECT_THROW(computeHistogram(at::Tensor()), c10::ValueError);
}

// ------------------------------------------------ reading the event file

double loadDouble(const std::string& s, size_t pos) {
  double v;
  std::memcpy(&v, s.data() + pos, 8); // little-endian hosts only, as the tests
  return v;
}

uint64_t readVarint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; pos < s.size(); shift += 7) {
    const auto byte = static_cast<unsigned char>(s[pos++]);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      break;
    }
  }
  return v;
}

std::string readBytes(const std::string& s, size_t& pos) {
  const size_t n = readVarint(s, pos);
  std::string out = s.substr(pos, n);
  pos += n;
  return out;
}

struct HistogramEvent {
  int64_t step = 0;
  std::string tag;
  Histogram histogram;
};

Histogram decodeHisto(const std::string& h) {
  Histogram out;
  size_t pos = 0;
  while (pos < h.size()) {
    const int key = static_cast<unsigned char>(h[pos++]);
    if ((key & 7) == 1) { // a double field
      const double v = loadDouble(h, pos);
      pos += 8;
      double* fields[] = {
          &out.min, &out.max, &out.num, &out.sum, &out.sumSquares};
      *fields[(key >> 3) - 1] = v;
      continue;
    }
    const std::string packed = readBytes(h, pos);
    auto& target = key == 0x32 ? out.bucketLimits : out.bucketCounts;
    for (size_t i = 0; i < packed.size(); i += 8) {
      target.push_back(loadDouble(packed, i));
    }
  }
  return out;
}

// Every histogram of the one event file in `dir`, in file order.
std::vector<HistogramEvent> readHistograms(const fs::path& dir) {
  std::vector<HistogramEvent> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string bytes = ss.str();
    for (size_t pos = 0; pos + 12 <= bytes.size();) {
      uint64_t length;
      std::memcpy(&length, bytes.data() + pos, 8);
      const std::string event = bytes.substr(pos + 12, length);
      pos += 12 + length + 4;
      HistogramEvent e;
      bool histogram = false;
      for (size_t p = 0; p < event.size();) {
        const int key = static_cast<unsigned char>(event[p++]);
        if (key == 0x09) {
          p += 8;
        } else if (key == 0x10) {
          e.step = static_cast<int64_t>(readVarint(event, p));
        } else if (key == 0x2a) {
          const std::string summary = readBytes(event, p);
          size_t sp = 1;
          const std::string value = readBytes(summary, sp);
          size_t vp = 1;
          e.tag = readBytes(value, vp);
          histogram = value[vp++] == 0x2a;
          if (histogram) {
            e.histogram = decodeHisto(readBytes(value, vp));
          }
        } else {
          readBytes(event, p); // file_version
        }
      }
      if (histogram) {
        out.push_back(e);
      }
    }
  }
  return out;
}

TEST(Histogram, EventBytesRoundTrip) {
  const Histogram h = computeHistogram(at::randn({50}) * 4);
  const std::string event =
      torch_monitor::sinks::tensorboard::histogramEvent(2.5, 9, "w", h);
  std::string record;
  torch_monitor::sinks::tensorboard::appendRecord(record, event);
  TempDir dir;
  std::ofstream(dir.path() / "events.out.tfevents.1", std::ios::binary)
      << record;
  const auto read = readHistograms(dir.path());
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].step, 9);
  EXPECT_EQ(read[0].tag, "w");
  EXPECT_EQ(read[0].histogram.bucketLimits, h.bucketLimits);
  EXPECT_EQ(read[0].histogram.bucketCounts, h.bucketCounts);
  EXPECT_EQ(read[0].histogram.min, h.min);
  EXPECT_EQ(read[0].histogram.max, h.max);
  EXPECT_EQ(read[0].histogram.num, 50.0);
  EXPECT_EQ(read[0].histogram.sum, h.sum);
  EXPECT_EQ(read[0].histogram.sumSquares, h.sumSquares);
}

// An omitted step is the training step, else the tag's own counter.
TEST(Histogram, WriterStepsGivenTrainingOrCounted) {
  TempDir dir;
  {
    TensorBoardWriter tb(dir.path().string());
    torch_monitor::clearStep();
    tb.addHistogram("a", at::ones({3}));
    tb.addHistogram("a", at::ones({3}));
    torch_monitor::setStep(40);
    tb.addHistogram("a", at::ones({3}));
    tb.addHistogram("b", at::ones({3}), 7);
    torch_monitor::clearStep();
    tb.addHistogram("a", at::ones({3}));
    EXPECT_THROW(tb.addHistogram("a", at::zeros({0})), c10::ValueError);
    tb.close();
    EXPECT_EQ(tb.dropped(), 0);
  }
  std::vector<std::pair<std::string, int64_t>> steps;
  for (const auto& e : readHistograms(dir.path())) {
    steps.emplace_back(e.tag, e.step);
    EXPECT_EQ(e.histogram.num, 3.0);
  }
  EXPECT_EQ(
      steps,
      (std::vector<std::pair<std::string, int64_t>>{
          {"a", 0}, {"a", 1}, {"a", 40}, {"b", 7}, {"a", 2}}));
}

// The docs' one line: a DifferenceMonitor's newest difference every N steps.
TEST(Histogram, DifferenceMonitorFeedsAHistogramEveryNSteps) {
  TempDir dir;
  auto tb = std::make_shared<TensorBoardWriter>(dir.path().string());
  auto monitor = std::make_shared<torch_monitor::DifferenceMonitor>(
      torch_monitor::makeReducer("PassthroughReducer", 1.0, 1000.0, false, false, {}),
      "weight");
  at::Tensor weight = at::zeros({4, 5});
  for (int64_t step = 0; step < 10; ++step) {
    monitor->before(weight, true);
    weight.add_(at::full({4, 5}, double(step)));
    monitor->after(weight, true);
    if (step % 4 == 0)
      if (auto d = monitor->reducer()->peek())
        tb->addHistogram("weight.update", *d, step);
  }
  tb->close();
  const auto read = readHistograms(dir.path());
  ASSERT_EQ(read.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const double step = 4.0 * i;
    EXPECT_EQ(read[i].step, int64_t(step));
    EXPECT_EQ(read[i].histogram.num, 20.0);
    EXPECT_EQ(read[i].histogram.min, step);
    EXPECT_EQ(read[i].histogram.sum, 20 * step);
    EXPECT_EQ(read[i].histogram.bucketCounts.back(), 20.0);
  }
}

} // namespace
