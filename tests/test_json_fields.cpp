// JsonFields: every read of a user-editable JSON file either gives a value of the right type and
// range or a user error (exit code 2) naming the file and the field; it never throws.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/json_fields.h"

namespace glm::test {
namespace {

const nlohmann::json kFile = nlohmann::json::parse(R"({
  "step": 12, "text": "abc", "negative": -7, "huge": 18446744073709551615, "float": 1e15,
  "ratio": 0.5, "flag": true, "none": null, "units": [1, 2, 3], "mixed": [1, "x"],
  "names": ["a", "b"], "nested": {"rank": 0, "alpha": "x"}
})");

void expect_error(const Status& s, const std::string& needle) {
  ASSERT_FALSE(s.is_ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(s.exit_code(), 2) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

JsonFields fields() { return JsonFields::of(kFile, "dir/meta.json").take(); }

TEST(JsonFields, GoodValuesAreRead) {
  const JsonFields f = fields();
  EXPECT_EQ(f.integer("step", 0).value(), 12);
  EXPECT_EQ(f.integer_or("absent", 5, 0, 10).value(), 5);
  EXPECT_EQ(f.integer_or("none", 5).value(), 5) << "null stands for absent";
  EXPECT_EQ(f.unsigned_integer("huge").value(), 18446744073709551615ull);
  EXPECT_EQ(f.number("ratio", 0, 1).value(), 0.5);
  EXPECT_EQ(f.number("step").value(), 12.0) << "an integer is a number";
  EXPECT_EQ(f.boolean("flag").value(), true);
  EXPECT_EQ(f.string("text").value(), "abc");
  EXPECT_EQ(f.string_or("absent", "d").value(), "d");
  EXPECT_EQ(f.integers("units", 1).value(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(f.strings("names").value(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(f.has("step"));
  EXPECT_FALSE(f.has("none"));
}

TEST(JsonFields, WrongTypeMissingOrOutOfRangeNamesFileAndField) {
  const JsonFields f = fields();
  expect_error(f.integer("text", 0).status(), "dir/meta.json: field 'text' must be an integer >= 0, got \"abc\"");
  expect_error(f.integer("negative", 0).status(), "field 'negative' must be an integer >= 0, got -7");
  expect_error(f.integer("step", 0, 10).status(), "field 'step' must be an integer in [0, 10], got 12");
  expect_error(f.integer("float").status(), "field 'float' must be an integer, got 1e+15");
  // Above int64: refused, never wrapped to -1.
  expect_error(f.integer("huge").status(), "field 'huge' must be an integer");
  expect_error(f.unsigned_integer("negative").status(), "field 'negative' must be an integer >= 0, got -7");
  expect_error(f.integer("absent").status(), "dir/meta.json: field 'absent' is missing");
  expect_error(f.integer("none").status(), "field 'none' is missing");
  expect_error(f.number("text").status(), "field 'text' must be a finite number, got \"abc\"");
  expect_error(f.number("ratio", 1, 2).status(), "field 'ratio' must be a number in [1, 2], got 0.5");
  expect_error(f.boolean("step").status(), "field 'step' must be true or false, got 12");
  expect_error(f.string("step").status(), "field 'step' must be a string, got 12");
  expect_error(f.integers("text").status(), "field 'text' must be a list of integers, got \"abc\"");
  expect_error(f.integers("mixed").status(), "field 'mixed[1]' must be an integer, got \"x\"");
  expect_error(f.integers("units", 2).status(), "field 'units[0]' must be an integer >= 2, got 1");
  expect_error(f.strings("mixed").status(), "field 'mixed[0]' must be a string, got 1");
  expect_error(f.object("text").status(), "field 'text' must be an object, got \"abc\"");
  expect_error(JsonFields::of(nlohmann::json::array(), "x.json").status(), "x.json is not a JSON object");
}

// read_json_object: the file's object, or one user error naming the file for each way it fails.
TEST(JsonFields, ReadJsonObjectNamesTheFileOfEachFailure) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("glm_json_fields_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const auto good = read_json_object(write("good.json", R"({"a": 1})"));
  ASSERT_TRUE(good.is_ok()) << good.status().message();
  EXPECT_EQ(good.value().at("a"), 1);
  expect_error(read_json_object(write("broken.json", R"({"a": )")).status(), "broken.json' is not valid JSON");
  expect_error(read_json_object(write("list.json", "[1, 2]")).status(), "list.json' is not a JSON object");
  expect_error(read_json_object((dir / "absent.json").string()).status(), "cannot open '");
  expect_error(read_json_object(dir.string()).status(), "not a regular file");
  fs::remove_all(dir);
}

TEST(JsonFields, NestedObjectsNameTheirPath) {
  const JsonFields nested = fields().object("nested").take();
  expect_error(nested.integer("rank", 1).status(), "dir/meta.json: field 'nested.rank' must be an integer >= 1, got 0");
  expect_error(nested.number("alpha").status(), "field 'nested.alpha' must be a finite number");
  expect_error(nested.error("alpha", "is odd"), "field 'nested.alpha' is odd");
}

TEST(JsonFields, ExcerptsAreShortAndNeverThrow) {
  EXPECT_EQ(json_excerpt(nlohmann::json(std::string(100, 'a'))).size(), 63u);
  // A string holding invalid UTF-8 (read from a file by a lenient parser) is shown replaced.
  EXPECT_NO_THROW(json_excerpt(nlohmann::json(std::string("caf\xe9"))));
}

}  // namespace
}  // namespace glm::test
