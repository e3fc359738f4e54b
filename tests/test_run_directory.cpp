// Temporary names unique to their writer and recognisable, and write failures that name the file and
// the system's reason.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/temp_names.h"
#include "io/durable_file.h"

namespace glm::test {
namespace {

namespace fs = std::filesystem;

fs::path fresh(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("glm_run_directory_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(TempNames, UniqueAndRecognised) {
  const fs::path target = "/some/dir/args.json";
  const fs::path a = temp_path_for(target), b = temp_path_for(target);
  EXPECT_NE(a, b) << "two writers, two names";
  EXPECT_EQ(a.parent_path(), target.parent_path()) << "beside the target: one rename";
  EXPECT_EQ(a.filename().string().rfind(".args.json.tmp-", 0), 0u) << a;
  EXPECT_EQ(temp_target_of(a.filename().string()), "args.json");
  EXPECT_EQ(temp_target_of(aside_path_for("/d/checkpoint-4").filename().string()), "checkpoint-4.old");
  EXPECT_EQ(temp_target_of(".checkpoint-4.tmp"), "checkpoint-4") << "the fixed names of earlier versions";
  EXPECT_EQ(temp_target_of("args.json.tmp"), "args.json");
  for (const char* name : {"args.json", "checkpoint-4", ".glm_hpc.lock", "a.tmpl", ".x.tmp-h-12-0123", ".tmp",
                           ".x.tmp-h.o-12-0123456789abcdef", ".x.tmp-h-1z-0123456789abcdef"})
    EXPECT_FALSE(temp_target_of(name).has_value()) << name;
}

// A file larger than the process may write (ulimit -f): the error names the file and the reason.
TEST(DurableFile, WriteFailureNamesFileAndReason) {
  const fs::path dir = fresh("fsize");
  struct rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const Status s = write_file_durably(dir / "args.json", std::string(5000, 'x'));
  ::setrlimit(RLIMIT_FSIZE, &old);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("cannot write '" + (dir / "args.json").string() + "': File too large"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(fs::is_empty(dir)) << "the temporary is removed";
}

// A full filesystem (a 16 KiB tmpfs, where this test may mount one): "No space left on device".
TEST(DurableFile, FullDiskNamesFileAndReason) {
  const fs::path dir = fresh("enospc");
  if (std::system(("mount -t tmpfs -o size=16k glm_enospc_test " + dir.string() + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN); DurableFile.WriteFailureNamesFileAndReason "
                    "covers the same path with ulimit -f";
  const Status s = write_file_durably(dir / "args.json", std::string(64 << 10, 'x'));
  const bool empty = fs::is_empty(dir);
  (void)std::system(("umount " + dir.string()).c_str());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("cannot write '" + (dir / "args.json").string() + "': No space left on device"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(empty) << "the temporary is removed";
}

}  // namespace
}  // namespace glm::test
