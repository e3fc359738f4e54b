// Where host memory and host threads sit relative to a GPU on a machine of several NUMA nodes:
// the node a PCI device hangs off (sysfs), the node's CPUs, and a scope in which this thread's new
// pages come from a chosen node. Everything degrades to "no preference" where the information is
// missing (a single node, containers without sysfs).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace glm {

// "0-3,8,10-11" (the kernel's cpulist format) -> {0, 1, 2, 3, 8, 10, 11}; empty on a malformed list.
std::vector<int> parse_cpu_list(std::string_view list);
// The NUMA node of PCI device bus_id ("0000:3B:00.0", any case); -1 where unknown.
int pci_numa_node(const std::string& bus_id);
// The NUMA nodes this machine has (1 where it cannot tell).
int numa_node_count();
// The CPUs of NUMA node `node` that this process may run on; empty where none or unknown.
std::vector<int> numa_node_cpus(int node);

// While alive, pages this thread touches first come from `node` where it has room
// (MPOL_PREFERRED); nothing where node < 0, the machine has one node, or the thread already has a
// policy of its own (numactl). Restores the default policy at its end.
class PreferNumaNode {
 public:
  explicit PreferNumaNode(int node);
  ~PreferNumaNode();
  PreferNumaNode(const PreferNumaNode&) = delete;
  PreferNumaNode& operator=(const PreferNumaNode&) = delete;
  bool active() const { return active_; }

 private:
  bool active_ = false;
};

}  // namespace glm
