// safetensors reading and writing, every header inconsistency as a clear error, and HF import
// errors (missing or misshapen tensors, unknown model types) naming the tensor or field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/hf_import.h"
#include "io/safetensors.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "glm_hpc_safetensors_tests" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A file with the given header text and data bytes, built by hand.
std::string raw_file(const std::string& name, const std::string& header, const std::string& data,
                     int64_t claimed_len = -1) {
  const std::string path = (scratch("raw") / name).string();
  std::ofstream out(path, std::ios::binary);
  uint64_t len = claimed_len >= 0 ? static_cast<uint64_t>(claimed_len) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header << data;
  return path;
}

void expect_error(const std::string& path, const std::string& needle) {
  auto r = SafetensorsFile::open(path);
  ASSERT_FALSE(r.is_ok()) << "expected an error containing '" << needle << "'";
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << "the message names the file";
}

TEST(Safetensors, RoundTripOfEveryFloatType) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3e-8f, 1e30f, -0.0f, 7.0f};
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc020, 0x0000, 0x7f80};         // 1, -2.5, 0, +inf
  const std::vector<uint16_t> f16 = {0x3c00, 0x3800, 0x0001, 0xfc00, 0xc500};  // 1, 0.5, 2^-24, -inf, -5
  const std::vector<double> f64 = {0.1, -1e-300};
  const std::string path = (scratch("roundtrip") / "t.safetensors").string();
  ASSERT_TRUE(write_safetensors(path, {{"a.f32", StDType::F32, {2, 3}, f32.data()},
                                       {"b.bf16", StDType::BF16, {4}, bf16.data()},
                                       {"c.f16", StDType::F16, {5}, f16.data()},
                                       {"d.f64", StDType::F64, {2}, f64.data()},
                                       {"e.empty", StDType::F32, {0, 3}, nullptr}})
                  .is_ok());
  auto r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const auto& f = r.value();
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.tensors().size(), 5u);
  auto read = [&](const char* name) {
    const StTensorInfo* t = f.find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> v(static_cast<size_t>(t->numel()));
    EXPECT_TRUE(read_as_f32(f, *t, v).is_ok());
    return v;
  };
  EXPECT_EQ(read("a.f32"), f32);
  EXPECT_EQ(f.find("a.f32")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(read("b.bf16"), (std::vector<float>{1.0f, -2.5f, 0.0f, INFINITY}));
  EXPECT_EQ(read("c.f16"), (std::vector<float>{1.0f, 0.5f, std::ldexp(1.0f, -24), -INFINITY, -5.0f}));
  EXPECT_EQ(read("d.f64"), (std::vector<float>{0.1f, -0.0f}));
  EXPECT_TRUE(read("e.empty").empty());
  // The header is padded so the data starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  EXPECT_EQ(len % 8, 0u);
  const std::vector<int32_t> ints = {1, 2};
  ASSERT_TRUE(write_safetensors(path, {{"i", StDType::I32, {2}, ints.data()}}).is_ok());
  auto ri = SafetensorsFile::open(path);
  std::vector<float> out(2);
  EXPECT_FALSE(read_as_f32(ri.value(), *ri.value().find("i"), out).is_ok()) << "integers are not weights";
}

TEST(Safetensors, ShardedWriteAndRead) {
  const fs::path dir = scratch("sharded");
  std::vector<std::vector<float>> data;
  std::vector<StTensorView> views;
  for (int i = 0; i < 7; ++i) data.push_back(std::vector<float>(static_cast<size_t>(10 + i), static_cast<float>(i)));
  for (int i = 0; i < 7; ++i)
    views.push_back(
        {std::string("t").append(std::to_string(i)), StDType::F32, {10 + i}, data[static_cast<size_t>(i)].data()});
  ASSERT_TRUE(write_sharded_safetensors(dir.string(), views, 120).is_ok());  // about two tensors a shard
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir / "model-00001-of-00004.safetensors"));
  auto c = SafetensorsCheckpoint::open(dir.string());
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c.value().names().size(), 7u);
  auto t5 = c.value().find("t5");
  ASSERT_NE(t5.file, nullptr);
  std::vector<float> v(15);
  ASSERT_TRUE(read_as_f32(*t5.file, *t5.info, v).is_ok());
  EXPECT_EQ(v[14], 5.0f);
  // A shard that disappeared is named.
  fs::remove(dir / "model-00002-of-00004.safetensors");
  auto broken = SafetensorsCheckpoint::open(dir.string());
  ASSERT_FALSE(broken.is_ok());
  EXPECT_NE(broken.status().message().find("model-00002-of-00004.safetensors"), std::string::npos);
  // One file only: model.safetensors, no index.
  const fs::path single = scratch("single");
  ASSERT_TRUE(write_sharded_safetensors(single.string(), views, 1 << 20).is_ok());
  EXPECT_TRUE(fs::exists(single / "model.safetensors"));
  EXPECT_FALSE(fs::exists(single / "model.safetensors.index.json"));
  EXPECT_FALSE(SafetensorsCheckpoint::open(scratch("empty").string()).is_ok());
}

TEST(Safetensors, EveryHeaderInconsistencyIsAnError) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\1');
  ASSERT_TRUE(SafetensorsFile::open(raw_file("ok", "{" + ok_entry + "}", eight)).is_ok());
  {
    const std::string path = (scratch("raw") / "short").string();
    std::ofstream(path) << "abc";
    expect_error(path, "too short");
  }
  expect_error(raw_file("len", "{" + ok_entry + "}", eight, 1000), "exceeds the file size");
  expect_error(raw_file("huge", "{}", "", int64_t{1} << 40), "too large");
  expect_error(raw_file("brace", "[" + ok_entry + "]", eight), "does not start with '{'");
  expect_error(raw_file("json", "{" + ok_entry, eight), "not valid JSON");
  expect_error(raw_file("dtype", R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", eight),
               "unknown dtype 'F31'");
  expect_error(raw_file("bytes", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight), "need 12 bytes");
  expect_error(raw_file("range", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight),
               "outside the 8-byte data section");
  expect_error(
      raw_file(
          "overlap",
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          eight),
      "overlaps");
  expect_error(raw_file("hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight), "unused bytes");
  expect_error(raw_file("tail", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight),
               "beyond the last tensor");
  expect_error(raw_file("dup", "{" + ok_entry + "," + ok_entry + "}", eight), "'a' appears twice");
  expect_error(raw_file("meta", R"({"__metadata__":{"format":1},)" + ok_entry + "}", eight), "not a string");
  expect_error(raw_file("shape", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight), "non-negative");
  expect_error(raw_file("offsets", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight), "data_offsets");
  expect_error((scratch("raw") / "missing").string(), "cannot open");
}

// A copy of a parity fixture whose config.json or weights we then damage.
fs::path fixture_copy(const std::string& name) {
  const fs::path dir = scratch(name);
  fs::copy(fs::path(GLM_SOURCE_DIR) / "tests/data/glm_a", dir, fs::copy_options::recursive);
  return dir;
}

void expect_import_error(const fs::path& dir, const std::string& needle) {
  auto m = read_hf_config(dir.string());
  Status s = m.status();
  if (m.is_ok()) {
    ParamLayout layout(m.value().config);
    s = load_hf_weights(m.value(), layout, [](int, std::span<const float>) { return Status::ok(); });
  }
  ASSERT_FALSE(s.is_ok()) << "expected an error containing '" << needle << "'";
  EXPECT_EQ(s.exit_code(), 2);
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

void edit_config(const fs::path& dir, const std::string& from, const std::string& to) {
  std::ifstream in(dir / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  // Concatenation rather than std::string::replace: GCC 12 raises a false -Wrestrict on it.
  text = text.substr(0, at) + to + text.substr(at + from.size());
  std::ofstream(dir / "config.json", std::ios::trunc) << text;
}

TEST(HfImport, ErrorsNameTheTensorOrField) {
  {
    auto dir = fixture_copy("layers");
    edit_config(dir, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    expect_import_error(dir, "has no tensor 'model.layers.2.input_layernorm.weight'");
  }
  {
    auto dir = fixture_copy("fewer_layers");
    edit_config(dir, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
    expect_import_error(dir, "holds tensor 'model.layers.1.");
  }
  {
    auto dir = fixture_copy("shape");
    edit_config(dir, "\"intermediate_size\": 384", "\"intermediate_size\": 400");
    expect_import_error(dir, "'model.layers.0.mlp.gate_up_proj.weight' in");
  }
  {
    auto dir = fixture_copy("type");
    edit_config(dir, "\"model_type\": \"glm\"", "\"model_type\": \"glm4\"");
    expect_import_error(dir, "GLM-4-0414");
  }
  for (const char* value : {"4", "null", "[\"glm\"]"}) {
    auto dir = fixture_copy("type_value");
    edit_config(dir, "\"model_type\": \"glm\"", std::string("\"model_type\": ") + value);
    expect_import_error(
        dir, std::string(value) == "null" ? "unsupported model_type \"\"" : "field 'model_type' must be a string");
  }
  {
    auto dir = fixture_copy("llama");
    edit_config(dir, "\"model_type\": \"glm\"", "\"model_type\": \"llama\"");
    expect_import_error(dir, "unsupported model_type \"llama\"");
  }
  {
    auto dir = fixture_copy("field");
    edit_config(dir, "\"hidden_size\": 256,", "");
    expect_import_error(dir, "config.json: field 'hidden_size' is missing");
  }
  {
    auto dir = fixture_copy("field_type");
    edit_config(dir, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": \"two\"");
    expect_import_error(dir, "config.json: field 'num_hidden_layers' must be an integer >= 0, got \"two\"");
  }
  {
    auto dir = fixture_copy("field_range");
    edit_config(dir, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": -2");
    expect_import_error(dir, "config.json: field 'num_hidden_layers' must be an integer >= 0, got -2");
  }
  {
    auto dir = fixture_copy("field_number");
    edit_config(dir, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": \"1e-05\"");
    expect_import_error(dir, "config.json: field 'rms_norm_eps' must be a finite number, got \"1e-05\"");
  }
  {
    auto dir = fixture_copy("act");
    edit_config(dir, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"");
    expect_import_error(dir, "field 'hidden_act' must be \"silu\"");
  }
  {
    auto dir = fixture_copy("rope");
    edit_config(dir, "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"");
    expect_import_error(dir, "rope_type");
  }
  expect_import_error(scratch("nothing"), "config.json");
}

}  // namespace
}  // namespace glm::test
