// TensorBoard event files (--report_to tensorboard): TFRecord framing (little-endian length, masked
// CRC32C of the length, the record, masked CRC32C of the record) around Event messages serialized
// by protobuf from src/io/tensorboard_event.proto, which keeps TensorFlow's field numbers. One
// file, events.out.tfevents.<seconds>.<host>, per writer in the run's directory; a resumed run
// keeps the records of the steps up to the one it resumed from and drops the rest (as
// logging.jsonl does), so every step has one value whichever reader reads it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace glm {

// Whether this glm_hpc was built with protobuf (libprotobuf-dev and protobuf-compiler at build time).
bool tensorboard_available();

class TensorBoardWriter {
 public:
  // Writes into dir (created). resumed_step 0: a fresh run, earlier event files in dir are removed;
  // N > 0: their records of steps <= N are carried into this writer's file, the files removed.
  static Result<std::unique_ptr<TensorBoardWriter>> open(const std::string& dir, int64_t resumed_step);
  ~TensorBoardWriter();
  Status scalar(const std::string& tag, int64_t step, double value);
  // Markdown for TensorBoard's text dashboard.
  Status text(const std::string& tag, int64_t step, const std::string& markdown);
  Status flush();
  const std::string& path() const { return path_; }

 private:
  struct File;
  TensorBoardWriter() = default;
  Status write(const std::string& record);
  std::unique_ptr<File> file_;
  std::string path_;
};

}  // namespace glm
