// Progress of long work that is not a training step (tokenizing a dataset, loading or exporting a
// model's weights, evaluation): on a terminal one line rewritten in place with the share done, the
// rate and the time left; in a log (stderr not a terminal) a plain line now and then. Quiet for
// work that ends within the first seconds, and in every process but the one enable_progress chose
// (rank 0), so that a job's log holds one account.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace glm {

// Progress lines from this process (main: rank 0 only); off until called.
void enable_progress(bool on);
bool progress_enabled();

// "01:02:03"; "--:--:--" for a negative or non-finite time.
std::string format_duration(double seconds);

class Progress {
 public:
  enum class Unit { items, bytes };
  struct Output {
    std::FILE* file = nullptr;                    // null: stderr
    int terminal = -1;                            // 1 in place, 0 plain lines, -1: isatty(file)
    std::function<double()> now;                  // seconds; empty: the steady clock
    int enabled = -1;                             // 1 or 0; -1: progress_enabled()
  };
  static constexpr double kFirstAfter = 2.0;      // nothing is said of work done within this
  static constexpr double kTerminalEvery = 0.25;  // a terminal's line is rewritten at most this often
  static constexpr double kLogEvery = 30.0;       // a log gets a line this often

  // what: "tokenizing data/x.jsonl"; total: the units of the whole work (0: unknown, no share or
  // ETA); noun: what an item is ("samples", "tensors"; ignored for bytes). Silent unless
  // progress_enabled() (Output::enabled for tests).
  Progress(std::string what, int64_t total, Unit unit, std::string noun = "");
  Progress(std::string what, int64_t total, Unit unit, std::string noun, Output out);
  // Work that ends without finish() (an error, a stop) says nothing more; a terminal's line ends.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` units of `total` so far (monotonic); cheap enough for every item.
  void update(int64_t done);
  // The work is complete: "WHAT: done, N in T s (RATE)" where any line was printed.
  void finish();

 private:
  double seconds() const;
  std::string amount(double units) const;
  std::string line(bool final) const;
  void emit(bool final);

  std::string what_, noun_;
  int64_t total_ = 0, done_ = 0;
  Unit unit_;
  bool active_ = false, terminal_ = false, printed_ = false, finished_ = false;
  std::FILE* file_ = nullptr;
  std::function<double()> now_;
  double start_ = 0, last_print_ = -1e300;
  size_t last_width_ = 0;
};

}  // namespace glm
