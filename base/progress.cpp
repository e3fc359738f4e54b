// Progress lines: rate and time left from the start, in place on a terminal, plain in a log.
#include "base/progress.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>

namespace glm {
namespace {

std::atomic<bool> g_progress{false};

std::string number(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

}  // namespace

void enable_progress(bool on) { g_progress = on; }
bool progress_enabled() { return g_progress; }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--:--";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

Progress::Progress(std::string what, int64_t total, Unit unit, std::string noun)
    : Progress(std::move(what), total, unit, std::move(noun), Output{}) {}

Progress::Progress(std::string what, int64_t total, Unit unit, std::string noun, Output out)
    : what_(std::move(what)), noun_(std::move(noun)), total_(total), unit_(unit) {
  active_ = out.enabled >= 0 ? out.enabled == 1 : progress_enabled();
  file_ = out.file != nullptr ? out.file : stderr;
  terminal_ = out.terminal >= 0 ? out.terminal == 1 : ::isatty(::fileno(file_)) == 1;
  now_ = std::move(out.now);
  start_ = seconds();
}

Progress::~Progress() {
  if (finished_ || !printed_ || !terminal_) return;
  std::fprintf(file_, "\n");  // the terminal's line stays as it was, and the next output starts below it
  std::fflush(file_);
}

double Progress::seconds() const {
  if (now_) return now_();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string Progress::amount(double units) const {
  if (unit_ == Unit::items) {
    if (units >= 1e9) return number(units / 1e9, "%.2f billion");
    if (units >= 1e6) return number(units / 1e6, "%.1f million");
    return number(units, "%.0f");
  }
  if (units >= 1e9) return number(units / 1e9, "%.2f GB");
  if (units >= 1e6) return number(units / 1e6, "%.1f MB");
  return number(units / 1e3, "%.1f kB");
}

std::string Progress::line(bool final) const {
  const double elapsed = seconds() - start_;
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  const std::string noun = unit_ == Unit::items && !noun_.empty() ? " " + noun_ : "";
  const std::string per_second = amount(rate) + (unit_ == Unit::items ? noun + "/s" : "/s");
  if (final)
    return what_ + ": done, " + amount(static_cast<double>(done_)) + noun + " in " + number(elapsed, "%.1f") +
           " s (" + per_second + ")";
  std::string text = what_ + ": ";
  if (total_ > 0) {
    text += number(100.0 * static_cast<double>(done_) / static_cast<double>(total_), "%.0f%%") + " (" +
            amount(static_cast<double>(done_)) + " of " + amount(static_cast<double>(total_)) + noun + ", " +
            per_second + ", ETA " +
            format_duration(rate > 0 ? static_cast<double>(total_ - done_) / rate : -1.0) + ")";
  } else {
    text += amount(static_cast<double>(done_)) + noun + " (" + per_second + ")";
  }
  return text;
}

void Progress::emit(bool final) {
  const std::string text = "glm_hpc: " + line(final);
  if (terminal_) {
    // Rewritten in place; spaces cover what a longer earlier line left.
    const size_t pad = last_width_ > text.size() ? last_width_ - text.size() : 0;
    std::fprintf(file_, "\r%s%s%s", text.c_str(), std::string(pad, ' ').c_str(), final ? "\n" : "");
    last_width_ = text.size();
  } else {
    std::fprintf(file_, "%s\n", text.c_str());
  }
  std::fflush(file_);
  printed_ = true;
}

void Progress::update(int64_t done) {
  done_ = total_ > 0 ? std::min(done, total_) : done;
  if (!active_ || finished_) return;
  const double now = seconds();
  if (now - start_ < kFirstAfter) return;
  if (now - last_print_ < (terminal_ ? kTerminalEvery : kLogEvery)) return;
  last_print_ = now;
  emit(false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (active_ && printed_) emit(true);
}

}  // namespace glm
