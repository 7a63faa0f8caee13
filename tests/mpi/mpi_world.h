#pragma once
// The communicator of every process of the MPI test run.
#include <string>

#include "comm/communicator.h"

namespace fab::test {
Communicator& world();
// The root of this run's scratch folders: beside the build (the test's working directory), named by
// the world size, so two checkouts, and runs at 2 and 4 ranks, never share one.
std::string scratch_root();
// scratch_root()/name, emptied by rank 0, once every rank may use it (collective over world()).
std::string fresh_scratch_dir(const std::string& name);
}  // namespace fab::test
