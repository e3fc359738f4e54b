// Progress lines (base/progress.h) with a clock the test moves: quiet for short work, a plain line
// every kLogEvery seconds in a log, a line rewritten in place on a terminal at most every
// kTerminalEvery, the share, rate and time left right, and the closing line.
#include "base/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace glm::test {
namespace {

struct Captured {
  std::FILE* file = std::tmpfile();
  double now = 0;
  ~Captured() { std::fclose(file); }
  Progress::Output output(bool terminal, int enabled = 1) {
    return Progress::Output{file, terminal ? 1 : 0, [this] { return now; }, enabled};
  }
  std::string text() {
    std::fflush(file);
    std::rewind(file);
    std::string s;
    for (int c; (c = std::fgetc(file)) != EOF;) s += static_cast<char>(c);
    return s;
  }
};

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '\n') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

TEST(Progress, ShortWorkSaysNothing) {
  Captured c;
  {
    Progress p("tokenizing a.jsonl", 1000, Progress::Unit::bytes, "", c.output(false));
    c.now = 1.5;
    p.update(1000);
  }
  EXPECT_EQ(c.text(), "");
}

TEST(Progress, ALogGetsAPlainLineEveryInterval) {
  Captured c;
  {
    Progress p("evaluating", 400, Progress::Unit::items, "samples", c.output(false));
    for (int s = 1; s <= 100; ++s) {
      c.now = s;
      p.update(4 * s);  // 4 samples a second: 100 s in all
    }
    p.finish();
  }
  const auto lines = lines_of(c.text());
  // At 2 s (the first), 32 s, 62 s and 92 s, then the closing line.
  ASSERT_EQ(lines.size(), 5u) << c.text();
  EXPECT_EQ(lines[0], "glm_hpc: evaluating: 2% (8 of 400 samples, 4 samples/s, ETA 00:01:38)");
  EXPECT_EQ(lines[1], "glm_hpc: evaluating: 32% (128 of 400 samples, 4 samples/s, ETA 00:01:08)");
  EXPECT_EQ(lines[4], "glm_hpc: evaluating: done, 400 samples in 100.0 s (4 samples/s)");
}

TEST(Progress, ATerminalLineIsRewrittenInPlace) {
  Captured c;
  {
    Progress p("loading the weights of m", 9'400'000'000, Progress::Unit::items, "parameters", c.output(true));
    for (int tick = 1; tick <= 40; ++tick) {  // every 0.1 s for 4 s, 1e9 parameters a second
      c.now = 0.1 * tick;
      p.update(static_cast<int64_t>(1e8) * tick);
    }
    p.finish();
    p.update(9'400'000'000);  // after finish: nothing more
  }
  const std::string text = c.text();
  size_t rewrites = 0;
  for (char ch : text) rewrites += ch == '\r' ? 1 : 0;
  // From 2.0 s to 4.0 s at most every 0.25 s: 2.0, 2.3, 2.6, 2.9, 3.2, 3.5, 3.8 (ticks of 0.1 s), and
  // the closing line.
  EXPECT_EQ(rewrites, 8u) << text;
  EXPECT_EQ(lines_of(text).size(), 1u);  // one line on the terminal, ended by the closing one
  EXPECT_NE(text.find("\rglm_hpc: loading the weights of m: 21% (2.00 billion of 9.40 billion parameters, "
                      "1.00 billion parameters/s, ETA 00:00:07)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("done, 4.00 billion parameters in 4.0 s"), std::string::npos) << text;
}

TEST(Progress, BytesAndUnknownTotals) {
  Captured c;
  {
    Progress p("tokenizing big.jsonl", 0, Progress::Unit::bytes, "", c.output(false));
    c.now = 3;
    p.update(1'500'000'000);
    p.finish();
  }
  const auto lines = lines_of(c.text());
  ASSERT_EQ(lines.size(), 2u) << c.text();
  EXPECT_EQ(lines[0], "glm_hpc: tokenizing big.jsonl: 1.50 GB (500.0 MB/s)");
  EXPECT_EQ(format_duration(3725.4), "01:02:05");
  EXPECT_EQ(format_duration(-1), "--:--:--");
}

// Work that fails or is stopped says nothing more than it had: no closing line; on a terminal
// its line is ended so that the error starts on a line of its own.
TEST(Progress, UnfinishedWorkHasNoClosingLine) {
  Captured c;
  {
    Progress p("evaluating", 100, Progress::Unit::items, "samples", c.output(true));
    c.now = 3;
    p.update(40);
  }
  const std::string text = c.text();
  EXPECT_EQ(text.find("done"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(lines_of(text).size(), 1u);
}

// Every rank but the one enable_progress(true) chose is silent, however long its work.
TEST(Progress, QuietInProcessesNotChosen) {
  for (const bool chosen : {false, true}) {
    enable_progress(chosen);
    EXPECT_EQ(progress_enabled(), chosen);
    Captured c;
    {
      Progress p("tokenizing a.jsonl", 100, Progress::Unit::bytes, "", c.output(false, -1));
      c.now = 100;
      p.update(50);
      p.finish();
    }
    EXPECT_EQ(c.text().empty(), !chosen) << c.text();
  }
  enable_progress(false);
}

}  // namespace
}  // namespace glm::test
