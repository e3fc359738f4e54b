// An HDF5 identifier owned by one object and closed with its own close function (io/ only: the rest
// of glm_hpc reads and writes checkpoint files through io/checkpoint_file.h).
#pragma once

#include <hdf5.h>

namespace glm {

class H5Handle {
 public:
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Handle() { release(); }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Closes now; false when the close failed (for a file: its metadata did not reach the disk).
  bool release() {
    const bool fine = id_ < 0 || close_(id_) >= 0;
    id_ = -1;
    return fine;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its own error stacks by default; our messages name the file and the dataset instead.
inline void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

}  // namespace glm
