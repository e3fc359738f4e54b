// Charts of logging.jsonl: gnuplot where installed, SVG written here otherwise.
#include "io/run_plots.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "base/errno_text.h"
#include "base/scope_exit.h"
#include "base/temp_names.h"
#include "base/text.h"
#include "io/durable_file.h"

extern char** environ;

namespace glm {
namespace {

namespace fs = std::filesystem;
using Points = std::vector<std::pair<double, double>>;  // (step, value)

struct RunData {
  std::string label;
  std::map<std::string, Points> series;  // logging.jsonl key -> its finite values by step
};

// One curve of a chart: a logging.jsonl key, scaled (MFU as a percentage).
struct Curve {
  const char* key;
  const char* label;
  double scale = 1.0;
};

struct ChartSpec {
  const char* file;  // without extension
  const char* title;
  const char* ylabel;
  std::vector<Curve> curves;
  bool smoothed = false;  // raw (light) and smoothed (full colour)
  bool markers = false;   // few points (evaluations): each one marked
};

const std::vector<ChartSpec>& chart_specs() {
  static const std::vector<ChartSpec> specs = {
      {"train_loss", "training loss", "loss", {{"loss", "loss"}}, true, false},
      {"eval_loss", "evaluation loss", "eval loss", {{"eval_loss", "eval loss"}}, false, true},
      {"eval_token_acc", "evaluation token accuracy", "token accuracy", {{"eval_token_acc", "token accuracy"}}, false,
       true},
      {"train_learning_rate", "learning rate", "learning rate", {{"learning_rate", "learning rate"}}, false, false},
      {"train_grad_norm", "gradient norm (before clipping)", "grad norm", {{"grad_norm", "grad norm"}}, false, false},
      {"train_tokens_per_second", "throughput", "tokens/s", {{"tokens_per_second", "tokens/s"}}, false, false},
      {"train_mfu", "model FLOPs utilisation", "MFU (%)", {{"mfu", "MFU", 100.0}}, false, false},
      {"train_memory", "memory (rank 0)", "GiB", {{"device_memory_gib", "device"}, {"host_memory_gib", "host"}}, false,
       false},
  };
  return specs;
}

// A line as both renderers draw it.
struct Line {
  std::string label;
  std::string color;  // #rrggbb
  double width = 2.0;
  bool markers = false;
  Points points;
};

struct Chart {
  std::string file, title, ylabel;
  std::vector<Line> lines;
};

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

// The colour mixed with white: the raw curve behind its smoothed one.
std::string lighter(const std::string& color) {
  unsigned r = 0, g = 0, b = 0;
  std::sscanf(color.c_str(), "#%02x%02x%02x", &r, &g, &b);
  auto mix = [](unsigned c) { return static_cast<unsigned>(std::lround(c + (255.0 - c) * 0.6)); };
  char out[8];
  std::snprintf(out, sizeof(out), "#%02x%02x%02x", mix(r), mix(g), mix(b));
  return out;
}

Result<RunData> read_run(const std::string& dir) {
  const fs::path path = fs::path(dir) / "logging.jsonl";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return GLM_USER_ERROR("'", dir, "' is not a directory (give glm_hpc plot a run's --output_dir)");
  std::ifstream in(path);
  if (!in) return GLM_USER_ERROR("'", dir, "' has no readable logging.jsonl (is it a glm_hpc --output_dir?)");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  RunData run;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(lines[i], nullptr, false);
    const bool torn_last = i + 1 == lines.size();
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number()) {
      if (torn_last) break;  // a kill while the record was written
      return GLM_USER_ERROR(path.string(), ":", i + 1, ": not a logging.jsonl record");
    }
    if (j.contains("skipped")) continue;  // a skipped update: nothing applied, no curve point
    const double step = j["step"].get<double>();
    for (const auto& [key, value] : j.items())
      if (key != "step" && value.is_number() && std::isfinite(value.get<double>()))
        run.series[key].emplace_back(step, value.get<double>());
  }
  if (run.series.find("loss") == run.series.end())
    return GLM_USER_ERROR(path.string(), " has no training step yet (no record with a finite loss)");
  return run;
}

// Each run's label: its directory's name, or the path where two names are the same.
void label_runs(std::vector<RunData>& runs, const std::vector<std::string>& dirs) {
  std::map<std::string, int> count;
  std::vector<std::string> names;
  for (const auto& d : dirs) {
    std::string name = fs::path(d).lexically_normal().filename().string();
    if (name.empty() || name == ".") name = fs::absolute(d).lexically_normal().parent_path().filename().string();
    names.push_back(name);
    ++count[name];
  }
  for (size_t i = 0; i < runs.size(); ++i) runs[i].label = count[names[i]] > 1 ? dirs[i] : names[i];
}

std::vector<Chart> build_charts(const std::vector<RunData>& runs, double smoothing) {
  std::vector<Chart> charts;
  const bool several = runs.size() > 1;
  for (const ChartSpec& spec : chart_specs()) {
    Chart chart{spec.file, spec.title, spec.ylabel, {}};
    for (size_t r = 0; r < runs.size(); ++r) {
      for (size_t c = 0; c < spec.curves.size(); ++c) {
        const Curve& curve = spec.curves[c];
        const auto it = runs[r].series.find(curve.key);
        if (it == runs[r].series.end()) continue;
        Line line;
        line.color = kPalette[(r * spec.curves.size() + c) % std::size(kPalette)];
        line.markers = spec.markers;
        for (const auto& [x, y] : it->second) line.points.emplace_back(x, y * curve.scale);
        std::string label = several ? runs[r].label : std::string(curve.label);
        if (several && spec.curves.size() > 1) label += std::string(" ") + curve.label;
        if (spec.smoothed && smoothing > 0 && line.points.size() > 1) {
          Line raw = line;
          raw.label = label + " (raw)";
          raw.color = lighter(line.color);
          raw.width = 1.0;
          std::vector<double> ys;
          for (const auto& p : line.points) ys.push_back(p.second);
          const std::vector<double> smooth = smooth_series(ys, smoothing);
          for (size_t i = 0; i < smooth.size(); ++i) line.points[i].second = smooth[i];
          line.label = label + " (smoothed)";
          chart.lines.push_back(std::move(raw));
        } else {
          line.label = label;
        }
        chart.lines.push_back(std::move(line));
      }
    }
    if (!chart.lines.empty()) charts.push_back(std::move(chart));
  }
  return charts;
}

// A gnuplot single-quoted string: only the quote itself is doubled.
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out + "'";
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

// gnuplot's script for every chart with the terminal given, its data beside it in work.
Result<std::string> gnuplot_script(const std::vector<Chart>& charts, const fs::path& work, const fs::path& images,
                                   const std::string& terminal, int width, int height) {
  std::string s = concat("set terminal ", terminal, " noenhanced size ", width, ",", height, "\n",
                         "set grid\nset key top right opaque box\nset xlabel 'step'\nset border lw 1\n");
  for (size_t c = 0; c < charts.size(); ++c) {
    const Chart& chart = charts[c];
    s += concat("set output ", gp_quote((images / (chart.file + ".png")).string()), "\n");
    s += concat("set title ", gp_quote(chart.title), "\nset ylabel ", gp_quote(chart.ylabel), "\nplot ");
    for (size_t l = 0; l < chart.lines.size(); ++l) {
      const Line& line = chart.lines[l];
      const fs::path data = work / concat("chart", c, "_line", l, ".dat");
      std::string rows;
      for (const auto& [x, y] : line.points) rows += number_text(x) + " " + number_text(y) + "\n";
      std::ofstream out(data);
      out << rows;
      if (!out.flush()) return GLM_FILE_ERROR("cannot write", data, errno);
      s += concat(l == 0 ? "" : ", ", gp_quote(data.string()), " using 1:2 with ",
                  line.markers || line.points.size() < 2 ? "linespoints pt 7 ps 0.8" : "lines", " lw ",
                  line.width, " lc rgb ", gp_quote(line.color), " title ", gp_quote(line.label));
    }
    s += "\n";
  }
  return s + "unset output\n";
}

// Runs `gnuplot script`, its output into log: the exit status, or -1 with why_not set when it
// cannot start.
Result<int> run_gnuplot(const fs::path& script, const fs::path& log, std::string& why_not) {
  posix_spawn_file_actions_t actions;
  if (const int err = posix_spawn_file_actions_init(&actions); err != 0)
    return GLM_ERROR(ErrorKind::io, "cannot prepare to start gnuplot: ", errno_text(err));
  ScopeExit destroy([&] { posix_spawn_file_actions_destroy(&actions); });
  for (const int err :
       {posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0),
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644),
        posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO)})
    if (err != 0) return GLM_ERROR(ErrorKind::io, "cannot prepare to start gnuplot: ", errno_text(err));
  std::string program = "gnuplot", arg = script.string();
  char* argv[] = {program.data(), arg.data(), nullptr};
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  if (err != 0) {  // not on PATH (ENOENT), not executable, ...: the charts are drawn as SVG
    why_not = err == ENOENT ? "gnuplot is not on PATH" : "cannot start gnuplot: " + errno_text(err);
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return GLM_ERROR(ErrorKind::io, "waiting for gnuplot: ", errno_text(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// The charts through gnuplot: pngcairo, then the gd png terminal. Empty files when gnuplot is
// missing or fails (report.note says why).
Result<std::vector<std::string>> plot_with_gnuplot(const std::vector<Chart>& charts, const fs::path& images,
                                                   const PlotOptions& o, PlotReport& report) {
  const fs::path work = temp_path_for(images / "plot-data");
  std::error_code ec;
  fs::create_directories(work, ec);
  if (ec) return GLM_FILE_ERROR("cannot create", work, ec.value());
  ScopeExit remove([&] { fs::remove_all(work, ec); });
  for (const char* terminal : {"pngcairo", "png"}) {
    GLM_ASSIGN_OR_RETURN(const std::string script, gnuplot_script(charts, work, images, terminal, o.width, o.height));
    const fs::path script_path = work / "charts.gp", log = work / "gnuplot.log";
    GLM_RETURN_IF_ERROR(write_file_durably(script_path, script));
    GLM_ASSIGN_OR_RETURN(const int code, run_gnuplot(script_path, log, report.note));
    if (code < 0) return std::vector<std::string>();
    std::vector<std::string> files;
    for (const Chart& chart : charts) {
      const fs::path png = images / (chart.file + ".png");
      if (code == 0 && fs::file_size(png, ec) > 0 && !ec) files.push_back(png.string());
    }
    if (files.size() == charts.size()) {
      report.tool = concat("gnuplot (", terminal, ")");
      report.note.clear();
      return files;
    }
    report.note = concat("gnuplot failed (exit code ", code, "): ", first_line_of(log.string()));
  }
  return std::vector<std::string>();
}

// ---- SVG, where gnuplot is not ----

// Text for an SVG: valid UTF-8 (base/text.h), markup escaped, control characters dropped.
std::string xml_escape(const std::string& text) {
  const std::string s = printable_text(text);
  std::string out;
  for (char ch : s) {
    if (static_cast<unsigned char>(ch) < 0x20) continue;
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

// Ticks at 1, 2 or 5 times a power of ten, about six over [lo, hi].
std::vector<double> nice_ticks(double lo, double hi) {
  const double raw = (hi - lo) / 6.0;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power * 10.0;
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * power) {
      step = m * power;
      break;
    }
  std::vector<double> ticks;
  const double first = std::ceil(lo / step) * step;
  for (int i = 0; i < 20; ++i) {  // at most 13 by the choice of step; a bound against rounding
    const double t = first + i * step;
    if (t > hi + step * 1e-9) break;
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

// [lo, hi] widened by pad of its width; a range too narrow to draw (a constant, or values a few
// roundings apart) by 5% of its magnitude instead.
std::pair<double, double> padded_range(double lo, double hi, double pad) {
  if (!(hi - lo > std::abs(lo) * 1e-9 + 1e-300)) {
    const double d = std::max(std::abs(lo) * 0.05, 1e-12);
    return {lo - d, hi + d};
  }
  const double d = (hi - lo) * pad;
  return {lo - d, hi + d};
}

std::string svg_chart(const Chart& chart, int width, int height) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Line& line : chart.lines)
    for (const auto& [x, y] : line.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  std::tie(x0, x1) = padded_range(x0, x1, 0.0);
  std::tie(y0, y1) = padded_range(y0, y1, 0.05);
  const double left = 90, right = width - 30.0, top = 45, bottom = height - 60.0;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (right - left); };
  auto py = [&](double y) { return bottom - (y - y0) / (y1 - y0) * (bottom - top); };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 "
    << width << ' ' << height << "\" font-family=\"sans-serif\" font-size=\"13\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << width / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" << xml_escape(chart.title)
    << "</text>\n";
  for (double t : nice_ticks(y0, y1))
    s << "<line x1=\"" << left << "\" x2=\"" << right << "\" y1=\"" << py(t) << "\" y2=\"" << py(t)
      << "\" stroke=\"#dddddd\"/><text x=\"" << left - 8 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">"
      << number_text(t) << "</text>\n";
  for (double t : nice_ticks(x0, x1))
    s << "<line x1=\"" << px(t) << "\" x2=\"" << px(t) << "\" y1=\"" << top << "\" y2=\"" << bottom
      << "\" stroke=\"#dddddd\"/><text x=\"" << px(t) << "\" y=\"" << bottom + 18
      << "\" text-anchor=\"middle\">" << number_text(t) << "</text>\n";
  s << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << right - left << "\" height=\"" << bottom - top
    << "\" fill=\"none\" stroke=\"#444444\"/>\n"
    << "<text x=\"" << (left + right) / 2 << "\" y=\"" << height - 15 << "\" text-anchor=\"middle\">step</text>\n"
    << "<text transform=\"translate(20," << (top + bottom) / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << xml_escape(chart.ylabel) << "</text>\n";
  for (const Line& line : chart.lines) {
    s << "<polyline fill=\"none\" stroke=\"" << line.color << "\" stroke-width=\"" << line.width << "\" points=\"";
    for (const auto& [x, y] : line.points) s << px(x) << ',' << py(y) << ' ';
    s << "\"/>\n";
    if (line.markers || line.points.size() < 2)
      for (const auto& [x, y] : line.points)
        s << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"3.5\" fill=\"" << line.color << "\"/>\n";
  }
  double ly = top + 18;  // the legend, top right
  for (const Line& line : chart.lines) {
    s << "<line x1=\"" << right - 230 << "\" x2=\"" << right - 205 << "\" y1=\"" << ly - 4 << "\" y2=\"" << ly - 4
      << "\" stroke=\"" << line.color << "\" stroke-width=\"" << std::max(line.width, 2.0) << "\"/><text x=\""
      << right - 198 << "\" y=\"" << ly << "\">" << xml_escape(line.label) << "</text>\n";
    ly += 18;
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace

std::vector<double> smooth_series(const std::vector<double>& values, double weight) {
  std::vector<double> out(values.size());
  double last = 0, debias = 1;
  for (size_t i = 0; i < values.size(); ++i) {
    last = last * weight + (1 - weight) * values[i];
    debias *= weight;
    out[i] = weight > 0 && debias < 1 ? last / (1 - debias) : values[i];
  }
  return out;
}

Result<PlotReport> plot_runs(const PlotOptions& o) {
  if (o.runs.empty()) return GLM_USER_ERROR("glm_hpc plot needs at least one run directory (its --output_dir)");
  if (!(o.smoothing >= 0 && o.smoothing < 1)) return GLM_USER_ERROR("--plot_smoothing ", o.smoothing, " must be in [0, 1)");
  std::vector<RunData> runs;
  for (const auto& dir : o.runs) {
    GLM_ASSIGN_OR_RETURN(RunData run, read_run(dir));
    runs.push_back(std::move(run));
  }
  label_runs(runs, o.runs);
  const std::vector<Chart> charts = build_charts(runs, o.smoothing);
  const fs::path images(o.images_dir);
  std::error_code ec;
  fs::create_directories(images, ec);
  if (ec) return GLM_FILE_ERROR("cannot create", images, ec.value());
  // An earlier drawing's charts go first: none of them may pass for this one's (a chart this
  // run has no values for, a PNG beside a fresh SVG).
  for (const std::string& name : chart_file_names()) fs::remove(images / name, ec);
  PlotReport report;
  if (o.use_gnuplot) {
    GLM_ASSIGN_OR_RETURN(report.files, plot_with_gnuplot(charts, images, o, report));
    if (!report.files.empty()) return report;
  } else {
    report.note = "--plot_format svg";
  }
  report.tool = "svg";
  for (const Chart& chart : charts) {
    const fs::path svg = images / (chart.file + ".svg");
    GLM_RETURN_IF_ERROR(write_file_durably(svg, svg_chart(chart, o.width, o.height)));
    report.files.push_back(svg.string());
  }
  return report;
}

std::vector<std::string> chart_file_names() {
  std::vector<std::string> names;
  for (const ChartSpec& spec : chart_specs())
    for (const char* extension : {".png", ".svg"}) names.push_back(std::string(spec.file) + extension);
  return names;
}

std::string describe_plots(const PlotReport& report, const std::string& images_dir) {
  std::string names;
  for (const auto& f : report.files) names += (names.empty() ? "" : ", ") + fs::path(f).filename().string();
  return concat("glm_hpc: plots (", report.tool, report.note.empty() ? "" : "; " + report.note, ") in ", images_dir,
                ": ", names);
}

}  // namespace glm
