// Curves of training runs as images: `glm_hpc plot DIR...` and the end of every training run.
// The runs' logging.jsonl files become PNG charts drawn by gnuplot (pngcairo, else its png
// terminal); without gnuplot, SVG charts written here, rather than nothing. Several runs overlay on
// one chart per metric, one colour a run.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace glm {

struct PlotOptions {
  std::vector<std::string> runs;  // output directories holding logging.jsonl
  std::string images_dir;         // where the charts go (created)
  double smoothing = 0.9;         // TensorBoard's exponential moving average weight, debiased; 0: none
  bool use_gnuplot = true;        // false: SVG even where gnuplot is installed
  int width = 1000, height = 600;
};

struct PlotReport {
  std::vector<std::string> files;  // the charts written, in chart order
  std::string tool;                // "gnuplot (pngcairo)", "gnuplot (png)" or "svg"
  std::string note;                // why SVG, where gnuplot was wanted but failed or is missing
};

// One chart per metric that has a point in any run: train_loss (raw and smoothed), eval_loss,
// eval_token_acc, train_learning_rate, train_grad_norm, train_tokens_per_second, train_mfu and
// train_memory (device and host GiB). A missing directory or logging.jsonl, a malformed record that
// is not the last line (a kill may tear the last one) or a run without one train step is a user error.
Result<PlotReport> plot_runs(const PlotOptions& options);

// The file names plot_runs may write in images_dir (every chart, PNG and SVG).
std::vector<std::string> chart_file_names();

// One line for the console: "glm_hpc: plots (TOOL) in DIR: a.png, b.png".
std::string describe_plots(const PlotReport& report, const std::string& images_dir);

// TensorBoard's smoothing: s_i = w s_{i-1} + (1 - w) x_i from s_{-1} = 0, divided by 1 - w^(i+1).
std::vector<double> smooth_series(const std::vector<double>& values, double weight);

}  // namespace glm
