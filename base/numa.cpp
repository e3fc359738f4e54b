// sysfs for the topology, set_mempolicy(2) for the placement (no libnuma needed).
#include "base/numa.h"

#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>

#include "base/text.h"

namespace glm {

namespace {

bool parse_int(std::string_view text, int& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

std::vector<int> parse_cpu_list(std::string_view list) {
  while (!list.empty() && std::isspace(static_cast<unsigned char>(list.back()))) list.remove_suffix(1);
  std::vector<int> cpus;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view part = list.substr(0, comma);
    const size_t dash = part.find('-');
    int lo = 0, hi = 0;
    if (!parse_int(part.substr(0, dash), lo)) return {};
    hi = lo;
    if (dash != std::string_view::npos && !parse_int(part.substr(dash + 1), hi)) return {};
    if (lo < 0 || hi < lo || hi - lo > 1 << 16) return {};
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return cpus;
}

int pci_numa_node(const std::string& bus_id) {
  std::string id = bus_id;
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  int node = -1;
  if (!parse_int(first_line_of("/sys/bus/pci/devices/" + id + "/numa_node"), node)) return -1;
  return node;  // the kernel says -1 itself where the platform has no NUMA information
}

int numa_node_count() {
  const std::vector<int> nodes = parse_cpu_list(first_line_of("/sys/devices/system/node/online"));
  return nodes.empty() ? 1 : static_cast<int>(nodes.size());
}

std::vector<int> numa_node_cpus(int node) {
  if (node < 0) return {};
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return {};
  std::vector<int> cpus;
  for (int c : parse_cpu_list(first_line_of("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist")))
    if (c < CPU_SETSIZE && CPU_ISSET(c, &allowed)) cpus.push_back(c);
  return cpus;
}

PreferNumaNode::PreferNumaNode(int node) {
  if (node < 0 || node >= 64 || numa_node_count() < 2) return;
  // A policy the user set (numactl --membind, --preferred) is theirs to keep.
  int mode = MPOL_DEFAULT;
  if (syscall(SYS_get_mempolicy, &mode, nullptr, 0, nullptr, 0) != 0 || mode != MPOL_DEFAULT) return;
  const unsigned long mask = 1UL << node;
  active_ = syscall(SYS_set_mempolicy, MPOL_PREFERRED, &mask, sizeof(mask) * 8) == 0;
}

PreferNumaNode::~PreferNumaNode() {
  if (active_) syscall(SYS_set_mempolicy, MPOL_DEFAULT, nullptr, 0);
}

}  // namespace glm
