// Typed optional JSON fields with field-named errors.
#include "core/common/json_fields.h"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

namespace loraplex {
namespace {

enum class Fruit { kApple, kPear };
absl::string_view FruitName(Fruit fruit) {
  return fruit == Fruit::kApple ? "apple" : "pear";
}
constexpr std::array<Fruit, 2> kAllFruits = {Fruit::kApple, Fruit::kPear};

TEST(JsonFieldsTest, ReadsPresentFieldsAndKeepsDefaultsForAbsentOnes) {
  const nlohmann::json json = {{"rate", 0.5},    {"count", 7},
                               {"on", true},     {"name", "x"},
                               {"pair", {1, 2}}, {"fruit", "pear"}};
  JsonFields fields(json, "cfg.");
  double rate = 0, missing = 9;
  int64_t count = 0;
  int small = 0;
  bool on = false;
  std::string name;
  std::vector<double> pair;
  Fruit fruit = Fruit::kApple;
  ASSERT_TRUE(fields.Number("rate", &rate).ok());
  ASSERT_TRUE(fields.Number("missing", &missing).ok());
  ASSERT_TRUE(fields.Integer("count", &count).ok());
  ASSERT_TRUE(fields.Integer("count", &small).ok());
  ASSERT_TRUE(fields.Bool("on", &on).ok());
  ASSERT_TRUE(fields.String("name", &name).ok());
  ASSERT_TRUE(fields.NumberList("pair", 2, &pair).ok());
  ASSERT_TRUE(fields.Choice("fruit", kAllFruits, &FruitName, &fruit).ok());
  EXPECT_TRUE(fields.RejectUnknown().ok());
  EXPECT_EQ(rate, 0.5);
  EXPECT_EQ(missing, 9);
  EXPECT_EQ(count, 7);
  EXPECT_EQ(small, 7);
  EXPECT_TRUE(on);
  EXPECT_EQ(name, "x");
  EXPECT_EQ(pair, (std::vector<double>{1, 2}));
  EXPECT_EQ(fruit, Fruit::kPear);
}

TEST(JsonFieldsTest, WrongTypesNameTheFieldAndTheValue) {
  const nlohmann::json json = {{"rate", "fast"}, {"count", 1.5},
                               {"big", 1e12},    {"on", 1},
                               {"pair", {1}},    {"fruit", "plum"}};
  JsonFields fields(json, "cfg.");
  double rate = 0;
  int64_t count = 0;
  int big = 0;
  bool on = false;
  std::vector<double> pair;
  Fruit fruit = Fruit::kApple;
  EXPECT_EQ(fields.Number("rate", &rate).message(),
            "cfg.rate must be a number, got \"fast\"");
  EXPECT_EQ(fields.Integer("count", &count).message(),
            "cfg.count must be an integer, got 1.5");
  EXPECT_EQ(fields.Integer("big", &big).message(),
            "cfg.big must be an integer, got 1000000000000.0");
  EXPECT_EQ(fields.Bool("on", &on).message(),
            "cfg.on must be true or false, got 1");
  EXPECT_EQ(fields.NumberList("pair", 2, &pair).message(),
            "cfg.pair must be a list of 2 numbers, got a JSON array");
  EXPECT_EQ(fields.Choice("fruit", kAllFruits, &FruitName, &fruit).message(),
            "cfg.fruit must be one of apple, pear; got \"plum\"");
  EXPECT_EQ(fruit, Fruit::kApple);
}

TEST(JsonFieldsTest, IntegerOutOfIntRangeIsRejected) {
  const nlohmann::json json = {{"steps", 5000000000LL}};
  JsonFields fields(json, "cfg.");
  int steps = 1;
  EXPECT_EQ(fields.Integer("steps", &steps).message(),
            "cfg.steps is out of range, got 5000000000");
  EXPECT_EQ(steps, 1);
}

TEST(JsonFieldsTest, UnknownKeysAndNonObjectsAreRejected) {
  const nlohmann::json json = {{"rate", 1}, {"rtae", 2}};
  JsonFields fields(json, "cfg.");
  double rate = 0;
  ASSERT_TRUE(fields.Number("rate", &rate).ok());
  EXPECT_EQ(fields.RejectUnknown().message(),
            "cfg.rtae is not a known field (known: rate)");

  const nlohmann::json array = nlohmann::json::array();
  JsonFields not_object(array, "cfg.");
  EXPECT_TRUE(not_object.Number("rate", &rate).ok());
  EXPECT_EQ(not_object.RejectUnknown().message(),
            "cfg must be a JSON object, got a JSON array");
}

}  // namespace
}  // namespace loraplex
