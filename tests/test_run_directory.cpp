// One run per directory: temporary names, the directory lock (refusal, take-over of a dead, reused or
// silent holder, one winner among racing take-overs), the start-of-run clean-up of what killed runs
// left, and write failures that name the file and the system's reason.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "base/temp_names.h"
#include "cli/run_directory.h"
#include "io/dir_lock.h"
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

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string host() {
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

int64_t start_ticks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  std::istringstream fields(stat.substr(stat.rfind(')') + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) fields >> field;
  return std::stoll(field);
}

// A lock file as another run would have left it; fields override this machine's identity.
void plant_lock(const fs::path& file, const nlohmann::json& fields) {
  nlohmann::json j = {{"holder", "glm_hpc"},
                      {"command", "train"},
                      {"host", host()},
                      {"pid", 1},
                      {"started", "2020-01-01T00:00:00Z"},
                      {"boot_id", first_line("/proc/sys/kernel/random/boot_id")},
                      {"pid_namespace", fs::read_symlink("/proc/self/ns/pid").string()},
                      {"process_start", 1},
                      {"token", "0123456789abcdef"}};
  j.update(fields);
  std::ofstream(file) << j.dump(2) << "\n";
}

void age(const fs::path& file, int seconds) {
  struct timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds;
  times[1] = times[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
}

Result<std::shared_ptr<DirectoryLock>> take(const fs::path& dir) {
  return DirectoryLock::acquire(dir / kDirectoryLockFile, "--output_dir", dir.string(), "train");
}

// Waits until the unreaped child has ended (waitid with WNOWAIT leaves it a zombie).
bool wait_until_ended(pid_t child) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT) == 0;
}

pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

TEST(TempNames, UniqueAndRecognised) {
  const fs::path target = "/some/dir/args.json";
  const fs::path a = temp_path_for(target), b = temp_path_for(target);
  EXPECT_NE(a, b) << "two writers, two names";
  EXPECT_EQ(a.parent_path(), target.parent_path()) << "beside the target: one rename";
  EXPECT_EQ(a.filename().string().rfind(".args.json.tmp-", 0), 0u) << a;
  EXPECT_EQ(temp_target_of(a.filename().string()), "args.json");
  EXPECT_EQ(temp_target_of(aside_path_for("/d/checkpoint-4").filename().string()), "checkpoint-4.old");
  EXPECT_EQ(temp_target_of(".checkpoint-4.tmp"), "checkpoint-4") << "fixed names, as older builds wrote";
  EXPECT_EQ(temp_target_of("args.json.tmp"), "args.json");
  for (const char* name : {"args.json", "checkpoint-4", ".glm_hpc.lock", "a.tmpl", ".x.tmp-h-12-0123", ".tmp",
                           ".x.tmp-h.o-12-0123456789abcdef", ".x.tmp-h-1z-0123456789abcdef"})
    EXPECT_FALSE(temp_target_of(name).has_value()) << name;
}

TEST(DirectoryLock, SecondHolderIsRefusedNamingTheFirst) {
  const fs::path dir = fresh("second");
  auto first = take(dir);
  ASSERT_TRUE(first.is_ok()) << first.status().message();
  EXPECT_TRUE(first.value()->takeover_note().empty());
  auto second = take(dir);
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().exit_code(), 2);
  const std::string m = second.status().message();
  EXPECT_NE(m.find("--output_dir '" + dir.string() + "' is in use by another glm_hpc run"), std::string::npos) << m;
  EXPECT_NE(m.find("host " + host() + " (pid " + std::to_string(::getpid()) + ") since "), std::string::npos) << m;
  first.value()->release();
  EXPECT_FALSE(fs::exists(dir / kDirectoryLockFile));
  auto third = take(dir);
  EXPECT_TRUE(third.is_ok()) << third.status().message();
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename(), kDirectoryLockFile) << "no temporaries left beside the lock";
}

TEST(DirectoryLock, DeadHolderIsTakenOver) {
  const fs::path dir = fresh("dead");
  const pid_t gone = dead_pid();
  plant_lock(dir / kDirectoryLockFile, {{"pid", gone}});
  auto lock = take(dir);
  ASSERT_TRUE(lock.is_ok()) << lock.status().message();
  EXPECT_NE(lock.value()->takeover_note().find("process " + std::to_string(gone) + " is gone"), std::string::npos)
      << lock.value()->takeover_note();
  lock.value()->release();
  // Ended but not yet reaped (a zombie: what mpirun leaves of its ranks when it exits first).
  const pid_t zombie = ::fork();
  if (zombie == 0) ::_exit(0);
  ASSERT_TRUE(wait_until_ended(zombie));
  plant_lock(dir / kDirectoryLockFile, {{"pid", zombie}, {"process_start", start_ticks(zombie)}});
  auto again = take(dir);
  ::waitpid(zombie, nullptr, 0);
  ASSERT_TRUE(again.is_ok()) << again.status().message();
  EXPECT_NE(again.value()->takeover_note().find("process " + std::to_string(zombie) + " is gone"), std::string::npos)
      << again.value()->takeover_note();
}

TEST(DirectoryLock, ReusedPidIsNotTheHolder) {
  const fs::path dir = fresh("reused");
  const pid_t alive = ::getppid();  // alive, but not the process that took the lock
  plant_lock(dir / kDirectoryLockFile, {{"pid", alive}, {"process_start", start_ticks(alive) + 1}});
  auto lock = take(dir);
  ASSERT_TRUE(lock.is_ok()) << lock.status().message();
  EXPECT_NE(lock.value()->takeover_note().find("now belongs to another process"), std::string::npos)
      << lock.value()->takeover_note();
  lock.value()->release();
  // The same pid with its own start time is the holder.
  plant_lock(dir / kDirectoryLockFile, {{"pid", alive}, {"process_start", start_ticks(alive)}});
  auto refused = take(dir);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("(pid " + std::to_string(alive) + ")"), std::string::npos)
      << refused.status().message();
}

TEST(DirectoryLock, OtherMachineIsTakenOverOnlyAfterItsHeartbeatStops) {
  const fs::path dir = fresh("remote");
  const fs::path file = dir / kDirectoryLockFile;
  plant_lock(file, {{"host", "node-elsewhere"}, {"pid", 4242}, {"boot_id", "another-boot"}});
  auto refused = take(dir);
  ASSERT_FALSE(refused.is_ok());
  const std::string m = refused.status().message();
  EXPECT_NE(m.find("train on host node-elsewhere (pid 4242) since 2020-01-01T00:00:00Z"), std::string::npos) << m;
  EXPECT_NE(m.find("another machine"), std::string::npos) << m;
  EXPECT_NE(m.find("remove " + file.string()), std::string::npos) << "says how to remove it\n" << m;
  EXPECT_TRUE(fs::exists(file));
  age(file, DirectoryLock::kStaleSeconds + 60);
  auto lock = take(dir);
  ASSERT_TRUE(lock.is_ok()) << lock.status().message();
  EXPECT_NE(lock.value()->takeover_note().find("heartbeat stopped"), std::string::npos)
      << lock.value()->takeover_note();
}

TEST(DirectoryLock, UnreadableLockIsRefusedUntilOld) {
  const fs::path dir = fresh("garbage");
  const fs::path file = dir / kDirectoryLockFile;
  std::ofstream(file) << "not json";
  auto refused = take(dir);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("names no holder"), std::string::npos) << refused.status().message();
  age(file, DirectoryLock::kStaleSeconds + 60);
  EXPECT_TRUE(take(dir).is_ok());
}

TEST(DirectoryLock, ReleaseLeavesAnotherRunsLock) {
  const fs::path dir = fresh("foreign");
  auto lock = take(dir);
  ASSERT_TRUE(lock.is_ok());
  plant_lock(dir / kDirectoryLockFile, {{"pid", 4242}, {"host", "node-elsewhere"}});
  lock.value()->release();
  EXPECT_TRUE(fs::exists(dir / kDirectoryLockFile)) << "only its own lock file is removed";
}

// What runs killed while taking the lock left beside it goes once it is old; a young one may be
// another run's, taking the lock at this moment.
TEST(DirectoryLock, OldCandidatesAreRemoved) {
  const fs::path dir = fresh("candidates");
  const fs::path old = temp_path_for(dir / kDirectoryLockFile), young = temp_path_for(dir / kDirectoryLockFile);
  std::ofstream(old) << "{}";
  std::ofstream(young) << "{}";
  age(old, DirectoryLock::kStaleSeconds + 60);
  auto lock = take(dir);
  ASSERT_TRUE(lock.is_ok()) << lock.status().message();
  EXPECT_FALSE(fs::exists(old));
  EXPECT_TRUE(fs::exists(young));
}

// Several processes take over one stale lock at once: exactly one holds it.
TEST(DirectoryLock, RacingTakeOversHaveOneWinner) {
  const fs::path dir = fresh("race");
  plant_lock(dir / kDirectoryLockFile, {{"pid", dead_pid()}});
  constexpr int kRacers = 6;
  int results[2];
  ASSERT_EQ(::pipe(results), 0);
  pid_t racers[kRacers];
  for (pid_t& r : racers) {
    r = ::fork();
    if (r == 0) {
      auto lock = take(dir);
      const char won = lock.is_ok() ? '1' : '0';
      (void)!::write(results[1], &won, 1);
      if (lock.is_ok()) ::pause();  // holds it until the test ends this process
      ::_exit(0);
    }
  }
  int winners = 0;
  for (int i = 0; i < kRacers; ++i) {
    char won = 0;
    ASSERT_EQ(::read(results[0], &won, 1), 1);
    winners += won == '1';
  }
  for (const pid_t r : racers) {
    ::kill(r, SIGKILL);
    ::waitpid(r, nullptr, 0);
  }
  EXPECT_EQ(winners, 1);
}

// What killed runs left in a train output directory goes at the next start; the rest stays.
TEST(RunDirectory, TrainClaimRemovesStaleTemporaries) {
  const fs::path dir = fresh("cleanup");
  fs::create_directories(dir / "checkpoint-1");
  std::ofstream(dir / "checkpoint-1" / "COMPLETE") << "1\n";
  fs::create_directories(aside_path_for(dir / "checkpoint-1"));  // replaced: the aside goes
  const fs::path aside2 = aside_path_for(dir / "checkpoint-2");  // killed between the renames
  fs::create_directories(aside2);
  std::ofstream(aside2 / "COMPLETE") << "2\n";
  fs::create_directories(temp_path_for(dir / "checkpoint-3"));
  fs::create_directories(dir / ".checkpoint-4.tmp");
  std::ofstream(temp_path_for(dir / "args.json")) << "{";
  std::ofstream(dir / "latest.tmp") << "checkpoint-";
  std::ofstream(temp_path_for(dir / "logging.jsonl")) << "";
  std::ofstream(dir / "notes.tmp") << "the user's";
  const fs::path foreign = temp_path_for(dir / "model.safetensors");  // not a name train writes
  std::ofstream(foreign) << "export's";
  CliOptions o;
  o.command = "train";
  o.train.output_dir = dir.string();
  o.train.resume_from_checkpoint = "latest";  // the run continues the earlier one's checkpoints
  auto claimed = claim_run_directory(o);
  ASSERT_TRUE(claimed.is_ok()) << claimed.status().message();
  const std::string report = claimed.value()->report();
  EXPECT_NE(report.find("glm_hpc: removed what earlier runs left in " + dir.string() + ": "), std::string::npos)
      << report;
  EXPECT_EQ(std::count(report.begin(), report.end(), ','), 5) << "six removed\n" << report;
  EXPECT_NE(report.find("what an interrupted replacement had moved aside: " + aside2.filename().string() +
                        " (directory) as checkpoint-2"),
            std::string::npos)
      << report;
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir)) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  std::vector<std::string> expected = {
      ".glm_hpc.lock", foreign.filename().string(), "checkpoint-1", "checkpoint-2", "notes.tmp", "run_status.json"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(left, expected) << report;
  EXPECT_TRUE(fs::exists(dir / "checkpoint-2" / "COMPLETE")) << "the aside came back";
  EXPECT_TRUE(fs::exists(dir / "checkpoint-1" / "COMPLETE"));
  const auto status = nlohmann::json::parse(std::ifstream(dir / "run_status.json"));
  EXPECT_EQ(status["status"], "running");
  EXPECT_TRUE(status["exit_code"].is_null());
  claimed.value()->release();
  EXPECT_FALSE(fs::exists(dir / kDirectoryLockFile));
}

// prepare holds its --output_dir and export its --save_dir (through a lock beside it, since the
// directory appears by one rename at the end) like train: a second claim is refused naming the first.
TEST(RunDirectory, PrepareAndExportAreHeldToo) {
  const fs::path root = fresh("held");
  CliOptions prepare;
  prepare.command = "prepare";
  prepare.train.output_dir = (root / "prepared").string();
  prepare.effective["output_dir"] = {{"value", prepare.train.output_dir}, {"source", "command_line"}};
  CliOptions exporting;
  exporting.command = "export";
  exporting.save_dir = (root / "hf").string();
  for (const CliOptions* o : {&prepare, &exporting}) {
    const bool is_export = o == &exporting;
    auto first = claim_run_directory(*o);
    ASSERT_TRUE(first.is_ok()) << first.status().message();
    const fs::path lock = is_export ? root / ".hf.glm_hpc.lock" : root / "prepared" / kDirectoryLockFile;
    EXPECT_TRUE(fs::exists(lock)) << lock;
    auto second = claim_run_directory(*o);
    ASSERT_FALSE(second.is_ok());
    EXPECT_EQ(second.status().exit_code(), 2);
    const std::string option = is_export ? "--save_dir '" + exporting.save_dir : "--output_dir '" + prepare.train.output_dir;
    EXPECT_NE(second.status().message().find(option + "' is in use by another glm_hpc run: " + o->command + " on host " +
                                             host() + " (pid " + std::to_string(::getpid()) + ")"),
              std::string::npos)
        << second.status().message();
    first.value()->release();
    EXPECT_FALSE(fs::exists(lock));
  }
}

// A directory the claim created for a run that wrote nothing (refused later) does not stay behind.
TEST(RunDirectory, CreatedDirectoryIsRemovedWhenNothingWasWritten) {
  const fs::path dir = fresh("created") / "prepared";
  CliOptions o;
  o.command = "prepare";
  o.train.output_dir = dir.string();
  o.effective["output_dir"] = {{"value", dir.string()}, {"source", "command_line"}};
  auto claimed = claim_run_directory(o);
  ASSERT_TRUE(claimed.is_ok()) << claimed.status().message();
  EXPECT_TRUE(fs::exists(dir / kDirectoryLockFile));
  EXPECT_FALSE(fs::exists(dir / "run_status.json")) << "train's alone";
  claimed.value()->release();
  EXPECT_FALSE(fs::exists(dir));
}

// A file larger than the process may write (ulimit -f): the error names the file and the reason.
TEST(DurableFile, WriteFailureNamesFileAndReason) {
  const fs::path dir = fresh("fsize");
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const Status s = write_file_durably(dir / "args.json", std::string(5000, 'x'));
  ::setrlimit(RLIMIT_FSIZE, &old);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("cannot write '" + (dir / "args.json").string() + "': File too large"), std::string::npos)
      << s.message();
  EXPECT_TRUE(fs::is_empty(dir)) << "the temporary is removed";
}

// A full filesystem (a 16 KiB tmpfs, where this test may mount one): "No space left on device".
TEST(DurableFile, FullDiskNamesFileAndReason) {
  const fs::path dir = fresh("enospc");
  if (std::system(("mount -t tmpfs -o size=16k glm_enospc_test " + dir.string() + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP()
        << "cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN); DurableFile.WriteFailureNamesFileAndReason "
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
