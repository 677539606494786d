// fault_sites.cpp — see fault_sites.h.
#include "parallel/runner/fault_sites.h"

namespace sl::parallel {

namespace {
thread_local const FaultSites* tls_sites = nullptr;  // per rank thread: its probe's, or none
}  // namespace

const FaultSites* FaultSites::here() { return tls_sites; }

void FaultSites::set_here(const FaultSites* sites) { tls_sites = sites; }

}  // namespace sl::parallel
