// Aggregation names, parsing and AggregationSet.

#include <cctype>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/monitor/counters.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using test::expectValueError;

const std::vector<std::pair<Aggregation, std::string>> kAll = {
    {Aggregation::VALUE, "value"},
    {Aggregation::MEAN, "mean"},
    {Aggregation::COUNT, "count"},
    {Aggregation::SUM, "sum"},
    {Aggregation::MAX, "max"},
    {Aggregation::MIN, "min"},
};

// The fragment every "invalid aggregation" message must contain.
const std::initializer_list<std::string> kChoices = {
    "value", "mean", "count", "sum", "max", "min", "1..6"};

TEST(Aggregation, IntegerValues) {
  EXPECT_EQ(static_cast<int>(Aggregation::NONE), 0);
  EXPECT_EQ(static_cast<int>(Aggregation::VALUE), 1);
  EXPECT_EQ(static_cast<int>(Aggregation::MEAN), 2);
  EXPECT_EQ(static_cast<int>(Aggregation::COUNT), 3);
  EXPECT_EQ(static_cast<int>(Aggregation::SUM), 4);
  EXPECT_EQ(static_cast<int>(Aggregation::MAX), 5);
  EXPECT_EQ(static_cast<int>(Aggregation::MIN), 6);
  EXPECT_EQ(NUM_AGGREGATIONS, 7);
}

TEST(Aggregation, Names) {
  for (const auto& [aggregation, name] : kAll) {
    EXPECT_EQ(std::string(aggregationName(aggregation)), name);
  }
  EXPECT_EQ(std::string(aggregationName(Aggregation::NONE)), "none");
}

// Same integer values and names as torch::monitor, so ints stored by code or
// saved models written for torch.monitor keep their meaning.
TEST(Aggregation, MatchesTorchMonitor) {
  EXPECT_EQ(NUM_AGGREGATIONS, torch::monitor::NUM_AGGREGATIONS);
  for (int i = 1; i < NUM_AGGREGATIONS; ++i) {
    const auto theirs = static_cast<torch::monitor::Aggregation>(i);
    EXPECT_EQ(
        std::string(aggregationName(static_cast<Aggregation>(i))),
        std::string(torch::monitor::aggregationName(theirs)))
        << "aggregation " << i;
  }
}

TEST(Aggregation, FromNameIsCaseInsensitive) {
  for (const auto& [aggregation, name] : kAll) {
    EXPECT_EQ(aggregationFromName(name), aggregation) << name;
    std::string upper = name;
    for (char& c : upper) {
      c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    EXPECT_EQ(aggregationFromName(upper), aggregation) << upper;
    std::string mixed = name;
    mixed[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(mixed[0])));
    EXPECT_EQ(aggregationFromName(mixed), aggregation) << mixed;
  }
  EXPECT_EQ(aggregationFromName("mEaN"), Aggregation::MEAN);
}

TEST(Aggregation, FromNameRoundTripsName) {
  for (int i = 1; i < NUM_AGGREGATIONS; ++i) {
    const auto a = static_cast<Aggregation>(i);
    EXPECT_EQ(aggregationFromName(aggregationName(a)), a);
  }
}

TEST(Aggregation, FromNameRejectsUnknownNames) {
  for (const char* bad :
       {"avg", "", "none", "NONE", " sum", "sum ", "summ", "su", "values",
        "1", "4"}) {
    SCOPED_TRACE(std::string("name '") + bad + "'");
    expectValueError([&] { aggregationFromName(bad); }, kChoices);
  }
  // The message names the offending input.
  expectValueError([] { aggregationFromName("median"); }, {"median"});
}

TEST(Aggregation, FromInt) {
  for (int64_t i = 1; i <= 6; ++i) {
    EXPECT_EQ(static_cast<int64_t>(aggregationFromInt(i)), i);
  }
  EXPECT_EQ(aggregationFromInt(1), Aggregation::VALUE);
  EXPECT_EQ(aggregationFromInt(6), Aggregation::MIN);
}

TEST(Aggregation, FromIntRejectsOutOfRange) {
  for (int64_t bad :
       {int64_t(0), int64_t(7), int64_t(-1), int64_t(100),
        std::numeric_limits<int64_t>::max(),
        std::numeric_limits<int64_t>::min(),
        // Would alias 4 (SUM) if truncated to 32 bits.
        (int64_t(1) << 32) + 4}) {
    SCOPED_TRACE("int " + std::to_string(bad));
    expectValueError([&] { aggregationFromInt(bad); }, kChoices);
  }
  expectValueError([] { aggregationFromInt(42); }, {"42"});
}

TEST(AggregationSet, DefaultIsEmpty) {
  const AggregationSet set;
  EXPECT_TRUE(set.empty());
  EXPECT_TRUE(set.members().empty());
  for (int i = 0; i < NUM_AGGREGATIONS; ++i) {
    EXPECT_FALSE(set.contains(static_cast<Aggregation>(i)));
  }
}

TEST(AggregationSet, DeduplicatesAndSortsMembers) {
  const AggregationSet set({Aggregation::SUM, Aggregation::MIN,
                            Aggregation::SUM, Aggregation::MEAN,
                            Aggregation::SUM, Aggregation::MIN});
  EXPECT_FALSE(set.empty());
  EXPECT_EQ(
      set.members(),
      (std::vector<Aggregation>{
          Aggregation::MEAN, Aggregation::SUM, Aggregation::MIN}));
  EXPECT_TRUE(set.contains(Aggregation::SUM));
  EXPECT_TRUE(set.contains(Aggregation::MEAN));
  EXPECT_TRUE(set.contains(Aggregation::MIN));
  EXPECT_FALSE(set.contains(Aggregation::VALUE));
  EXPECT_FALSE(set.contains(Aggregation::COUNT));
  EXPECT_FALSE(set.contains(Aggregation::MAX));
  EXPECT_FALSE(set.contains(Aggregation::NONE));
}

TEST(AggregationSet, AllMembers) {
  std::vector<Aggregation> all;
  for (int i = NUM_AGGREGATIONS - 1; i >= 1; --i) {
    all.push_back(static_cast<Aggregation>(i));
  }
  const AggregationSet set(all);
  std::vector<Aggregation> expected(all.rbegin(), all.rend());
  EXPECT_EQ(set.members(), expected);
}

TEST(AggregationSet, EmptyVector) {
  const AggregationSet set(std::vector<Aggregation>{});
  EXPECT_TRUE(set.empty());
  EXPECT_TRUE(set.members().empty());
}

TEST(AggregationSet, RejectsNoneAndOutOfRange) {
  expectValueError(
      [] { AggregationSet({Aggregation::SUM, Aggregation::NONE}); }, kChoices);
  expectValueError(
      [] { AggregationSet({static_cast<Aggregation>(7)}); }, kChoices);
  expectValueError(
      [] { AggregationSet({static_cast<Aggregation>(-3)}); }, kChoices);
  expectValueError(
      [] { AggregationSet({static_cast<Aggregation>(31)}); }, kChoices);
}

} // namespace
} // namespace torch_monitor
