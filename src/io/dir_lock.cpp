// The directory lock (see dir_lock.h): creation by link(2), the liveness of a holder, take-over and
// the heartbeat.
#include "io/dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>

#include "base/temp_names.h"
#include "base/text.h"
#include "io/durable_file.h"

namespace glm {
namespace {

namespace fs = std::filesystem;

std::string raw_host_name() {
  char host[256] = {0};
  return ::gethostname(host, sizeof(host) - 1) == 0 ? std::string(host) : std::string("?");
}

std::string pid_namespace() {
  std::error_code ec;
  const fs::path link = fs::read_symlink("/proc/self/ns/pid", ec);
  return ec ? std::string() : link.string();
}

// Fields 3 (state) and 22 (start time, clock ticks after boot) of /proc/<pid>/stat; empty and -1
// when unknown.
struct ProcessStat {
  std::string state;
  int64_t start_ticks = -1;
};

ProcessStat process_stat(int64_t pid) {
  ProcessStat st;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return st;
  const size_t name_end = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (name_end == std::string::npos) return st;
  std::istringstream fields(stat.substr(name_end + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return st;
    if (i == 3) st.state = field;
  }
  try {
    st.start_ticks = std::stoll(field);
  } catch (...) {
  }
  return st;
}

int64_t process_start_ticks(int64_t pid) { return process_stat(pid).start_ticks; }

std::string utc_now_text() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

struct Holder {
  std::string command, host, started, boot_id, pid_namespace;
  int64_t pid = 0, process_start = -1;

  std::string describe() const { return concat(command, " on host ", host, " (pid ", pid, ") since ", started); }
};

std::string lock_content(const Holder& me) {
  std::mt19937_64 random{std::random_device{}()};
  char token[17];
  std::snprintf(token, sizeof(token), "%016llx", static_cast<unsigned long long>(random()));
  const nlohmann::ordered_json j = {{"holder", "glm_hpc"},
                                    {"command", me.command},
                                    {"host", me.host},
                                    {"pid", me.pid},
                                    {"started", me.started},
                                    {"boot_id", me.boot_id},
                                    {"pid_namespace", me.pid_namespace},
                                    {"process_start", me.process_start},
                                    {"token", token}};
  return j.dump(2) + "\n";
}

std::optional<Holder> parse_holder(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  Holder h;
  auto text_of = [&](const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
  };
  auto number_of = [&](const char* key) {
    return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : int64_t{-1};
  };
  h.command = text_of("command");
  h.host = text_of("host");
  h.started = text_of("started");
  h.boot_id = text_of("boot_id");
  h.pid_namespace = text_of("pid_namespace");
  h.pid = number_of("pid");
  h.process_start = number_of("process_start");
  if (h.host.empty() || h.pid <= 0 || h.pid > INT32_MAX) return std::nullopt;  // kill(2) reads pid_t
  return h;
}

// The lock file as found: its bytes, its holder when they parse, and how long ago its mtime was on
// the filesystem's clock (now = the mtime of a file this process just wrote there).
struct Found {
  bool present = false;
  std::string text;
  std::optional<Holder> holder;
  int64_t age_seconds = 0;
};

Result<Found> read_lock(const fs::path& lock_file, const fs::path& clock_file) {
  Found f;
  const int fd = ::open(lock_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return f;
    return GLM_FILE_ERROR("cannot read the lock file", lock_file, errno);
  }
  struct stat lock_stat = {};
  struct stat clock_stat = {};
  const bool stated = ::fstat(fd, &lock_stat) == 0 && ::stat(clock_file.c_str(), &clock_stat) == 0;
  char buffer[4096];
  ssize_t n = 0;
  while (f.text.size() < (64u << 10) && (n = ::read(fd, buffer, sizeof(buffer))) > 0) f.text.append(buffer, n);
  ::close(fd);
  f.present = true;
  f.holder = parse_holder(f.text);
  if (stated) f.age_seconds = static_cast<int64_t>(clock_stat.st_mtime) - static_cast<int64_t>(lock_stat.st_mtime);
  return f;
}

struct Judgement {
  bool stale = false;
  bool same_machine = false;
  std::string why;
};

Judgement judge(const Found& f, const Holder& me) {
  const int64_t stale_after = DirectoryLock::kStaleSeconds;
  if (!f.holder) {
    if (f.age_seconds > stale_after)
      return {true, false, concat("it names no holder and is ", f.age_seconds, " s old")};
    return {};
  }
  const Holder& h = *f.holder;
  const bool same_machine = h.host == me.host && !me.boot_id.empty() && h.boot_id == me.boot_id &&
                            !me.pid_namespace.empty() && h.pid_namespace == me.pid_namespace;
  if (same_machine) {
    // An ended process nobody has reaped yet (a zombie: mpirun's ranks once it exits) is gone too.
    const ProcessStat st = process_stat(h.pid);
    if ((::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH) || st.state == "Z" || st.state == "X")
      return {true, true, concat("process ", h.pid, " is gone")};
    if (st.start_ticks >= 0 && h.process_start >= 0 && st.start_ticks != h.process_start)
      return {true, true, concat("pid ", h.pid, " now belongs to another process")};
    return {false, true, ""};
  }
  if (f.age_seconds > stale_after) return {true, false, concat("its heartbeat stopped ", f.age_seconds, " s ago")};
  return {};
}

// Creates lock_file holding `text` (the candidate's bytes). False when it exists already.
Result<bool> create_lock(const fs::path& candidate, const fs::path& lock_file, const std::string& text) {
  if (::link(candidate.c_str(), lock_file.c_str()) == 0) return true;
  const int err = errno;
  if (err == EEXIST) {
    // NFS: a retransmitted link that succeeded the first time answers EEXIST; the count tells.
    struct stat st = {};
    return ::stat(candidate.c_str(), &st) == 0 && st.st_nlink == 2;
  }
  if (err != EPERM && err != EOPNOTSUPP && err != ENOSYS && err != EMLINK)
    return GLM_FILE_ERROR("cannot create the lock file", lock_file, err);
  // No hard links here: exclusive creation, then the content (a reader may see it empty meanwhile).
  const int fd = ::open(lock_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return false;
    return GLM_FILE_ERROR("cannot create the lock file", lock_file, errno);
  }
  const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int write_err = errno;
  ::close(fd);
  if (!wrote) {
    ::unlink(lock_file.c_str());
    return GLM_FILE_ERROR("cannot write the lock file", lock_file, write_err);
  }
  return true;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Removes the stale lock (whose bytes were `judged`); true when this run removed that very file.
// One run at a time does it, holding a POSIX record lock on <lock>.takeover (a file that stays:
// unlinking it would let two runs lock two different files; the kernel releases the record lock
// when its holder dies, so a killed run leaves nothing to judge): under it the lock is read and,
// still the judged one, unlinked. Its holder being dead, nobody else changes that file meanwhile,
// and the name is never vacated under a live lock (renaming the file aside to look at it would
// open that window: a third run could create its lock in it). Where the filesystem offers no
// record locks, the read and the unlink run unguarded.
Result<bool> take_over(const fs::path& lock_file, const std::string& judged) {
  const fs::path guard = lock_file.string() + ".takeover";
  const int fd = ::open(guard.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return GLM_FILE_ERROR("cannot open the take-over guard", guard, errno);
  struct flock region = {};
  region.l_type = F_WRLCK;
  region.l_whence = SEEK_SET;
  bool guarded = false;
  int err = 0;
  for (int tries = 0; tries < 100; ++tries) {  // another run holds it for microseconds
    if (::fcntl(fd, F_SETLK, &region) == 0) {
      guarded = true;
      break;
    }
    err = errno;
    if (err != EAGAIN && err != EACCES && err != EINTR) break;  // no record locks here
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!guarded && (err == EAGAIN || err == EACCES)) {
    ::close(fd);
    return false;  // someone is still taking over: look at the lock again
  }
  const bool removed = read_all(lock_file) == judged && ::unlink(lock_file.c_str()) == 0;
  ::close(fd);  // releases the record lock
  return removed;
}

// Candidates and asides of this lock that runs killed while taking it left, once older than a
// heartbeat could be: a younger one may belong to a run taking the lock right now.
void remove_old_candidates(const fs::path& lock_file, const fs::path& clock_file) {
  struct stat clock = {};
  if (::stat(clock_file.c_str(), &clock) != 0) return;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(lock_file.parent_path(), ec)) {
    const auto target = temp_target_of(entry.path().filename().string());
    struct stat st = {};
    if (target && *target == lock_file.filename().string() && entry.path() != clock_file &&
        ::lstat(entry.path().c_str(), &st) == 0 && clock.st_mtime - st.st_mtime > DirectoryLock::kStaleSeconds)
      ::unlink(entry.path().c_str());
  }
}

std::string refusal(const Found& f, const Judgement& j, const fs::path& lock_file, const std::string& option,
                    const std::string& shown_dir) {
  const std::string head = concat(option, " '", shown_dir, "' is in use by another glm_hpc run");
  const std::string remove_hint =
      concat("if you know that run has ended, remove ", lock_file.string(), " (a lock whose heartbeat has stopped for ",
             DirectoryLock::kStaleSeconds, " s is taken over)");
  if (!f.holder)
    return concat(head, ": its lock file ", lock_file.string(), " names no holder (", f.age_seconds, " s old); ",
                  remove_hint);
  const std::string who = concat(head, ": ", f.holder->describe());
  if (j.same_machine)
    return concat(who, ". Wait for it to end or choose another ", option, " (lock file ", lock_file.string(), ")");
  return concat(who, "; it runs on another machine (its heartbeat is ", std::max<int64_t>(f.age_seconds, 0),
                " s old). Wait for it to end, choose another ", option, ", or ", remove_hint);
}

}  // namespace

DirectoryLock::DirectoryLock(fs::path path, std::string content, std::string note)
    : path_(std::move(path)), content_(std::move(content)), note_(std::move(note)) {
  heartbeat_ = std::thread([this] { beat(); });
}

Result<std::shared_ptr<DirectoryLock>> DirectoryLock::acquire(const fs::path& lock_file, const std::string& option,
                                                              const std::string& shown_dir,
                                                              const std::string& command) {
  Holder me;
  me.command = command;
  me.host = raw_host_name();
  me.pid = ::getpid();
  me.started = utc_now_text();
  me.boot_id = first_line_of("/proc/sys/kernel/random/boot_id");
  me.pid_namespace = pid_namespace();
  me.process_start = process_start_ticks(me.pid);
  const std::string text = lock_content(me);
  // The candidate: the lock's bytes under a name of our own, linked to the lock's name.
  const fs::path candidate = temp_path_for(lock_file);
  {
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return GLM_FILE_ERROR("cannot write a lock file in", lock_file.parent_path(), errno);
    const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
    const int err = errno;
    ::close(fd);
    if (!wrote) {
      ::unlink(candidate.c_str());
      return GLM_FILE_ERROR("cannot write the lock file", candidate, err);
    }
  }
  struct RemoveCandidate {
    const fs::path& path;
    ~RemoveCandidate() { ::unlink(path.c_str()); }
  } remove_candidate{candidate};

  std::string note;
  constexpr int kDyingLooks = 20;
  constexpr int kAttempts = 8;  // each failed one means another run took or released the lock meanwhile
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    GLM_ASSIGN_OR_RETURN(const bool created, create_lock(candidate, lock_file, text));
    if (created) {
      (void)fsync_path(lock_file.parent_path());  // durable at once where it can be; the lock holds either way
      remove_old_candidates(lock_file, candidate);
      return std::shared_ptr<DirectoryLock>(new DirectoryLock(lock_file, text, note));
    }
    GLM_ASSIGN_OR_RETURN(const Found found, read_lock(lock_file, candidate));
    if (!found.present) continue;  // released between the two calls
    Judgement j = judge(found, me);
    // A launcher that has just ended may leave its ranks dying for a moment: look again before refusing.
    for (int look = 0; !j.stale && j.same_machine && look < kDyingLooks; ++look) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      j = judge(found, me);
    }
    if (!j.stale) return GLM_USER_ERROR(refusal(found, j, lock_file, option, shown_dir));
    GLM_ASSIGN_OR_RETURN(const bool took, take_over(lock_file, found.text));
    if (took)
      note = concat("took over the stale lock ", lock_file.string(), " of ",
                    found.holder ? found.holder->describe() : std::string("an unknown run"), ": ", j.why);
  }
  return GLM_ERROR(ErrorKind::io, "cannot take the lock ", lock_file.string(), " after ", kAttempts,
                   " attempts: other runs keep taking and releasing it");
}

void DirectoryLock::beat() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::seconds(kHeartbeatSeconds), [this] { return stopping_; })) {
    if (read_all(path_) != content_) {
      std::fprintf(stderr,
                   "glm_hpc: warning: the lock file %s is no longer this run's (removed by hand, or taken over by "
                   "another run that judged this one dead): another run may be writing beside this one\n",
                   path_.c_str());
      std::fflush(stderr);
      return;
    }
    ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);  // mtime = now, on the filesystem's clock
  }
}

void DirectoryLock::release() {
  if (released_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (read_all(path_) == content_ && ::unlink(path_.c_str()) == 0) (void)fsync_path(path_.parent_path());
}

DirectoryLock::~DirectoryLock() { release(); }

}  // namespace glm
